"""The tokenizer vocabulary of a random-weight ChatTTS, and ChatTTS's special tokens in the library's order."""

from __future__ import annotations

import string

#: ChatTTS's special tokens, in the library's order: its code relies on their relative ids.
_NAMED_TOKENS = (
    "Sasr Pasr Easr Stts Ptts Etts Sbreak Pbreak Ebreak uv_break v_break lbreak llbreak undefine laugh spk_emb "
    "empty_spk music pure"
)
SPECIAL_TOKENS = [
    *(f"[{name}]" for name in _NAMED_TOKENS.split()),
    *(f"[break_{i}]" for i in range(8)),
    *(f"[laugh_{i}]" for i in range(3)),
    *(f"[oral_{i}]" for i in range(10)),
    *(f"[speed_{i}]" for i in range(10)),
]

_CJK = range(0x4E00, 0xA000)


def _small() -> list[str]:
    letters = string.ascii_lowercase
    punctuation = list(",.?!'，。、？！")
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *(f"##{ch}" for ch in letters), *punctuation]


def vocabulary(size: int = 0) -> list[str]:
    """Return the small test vocabulary (``size`` 0), or one of exactly ``size`` entries that spells Chinese.

    The large one holds every CJK unified ideograph as its own token, as ChatTTS's (BERT Chinese) vocabulary
    does, so a Chinese text is as many tokens long as with the real tokenizer.
    """
    small = _small()
    if not size:
        return small
    entries = [*small, *string.digits, *(chr(c) for c in _CJK), *(f"##{chr(c)}" for c in _CJK)]
    if size > len(entries):
        raise ValueError(f"a vocabulary of at most {len(entries)} entries can be built, not {size}")
    return entries[:size]
