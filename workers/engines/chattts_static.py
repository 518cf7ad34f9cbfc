"""The static step ChatTTS serves with, checked at load against the growing loop on a short generation.

Each graph is checked against the same step run eagerly (``static_step.Graphs``), which shares the step's
buffers, views and attention kernel with it: a fault in those would pass. So before the static step serves,
a short generation of three prompts of different lengths (left padding, a bucket with a padding row) runs
through it and through the growing loop, with the same seeds, and their hidden states must agree, up to the
first step whose sampled tokens differ (past it, each goes its own way, as a different token must).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from workers.engines.chattts_generate import generate, prepare
from workers.engines.static_step import StaticStep, prepared_step

log = logging.getLogger(__name__)

#: Steps the check generates.
CHECK_TOKENS = 12
#: The largest difference of hidden states (against their largest magnitude) the static step may show, by dtype.
HIDDEN_TOLERANCE = {torch.float32: 1e-3, torch.float16: 5e-2, torch.bfloat16: 1e-1}


def checked_static_step(chat: Any, *, mode: str, rows: int, positions: int) -> tuple[StaticStep | None, str]:
    """Return the static step ``mode`` asks for (``prepared_step``) if it agrees with the growing loop, and what
    serves; one that does not agree is dropped, and the growing loop serves."""
    step, path = prepared_step(chat.gpt, mode=mode, rows=rows, positions=positions)
    if step is None:
        return None, path
    disagreement = disagreement_with_growing_loop(chat, step)
    step.outgrown = 0  # what the check made does not count
    if disagreement is not None:
        log.warning("the static step differs from the growing loop (%s): the growing loop serves", disagreement)
        return None, f"growing cache, eager step (the static step differed from it: {disagreement})"
    return step, path


@torch.inference_mode()
def disagreement_with_growing_loop(chat: Any, step: StaticStep) -> str | None:
    """Run a short generation through ``step`` and through the growing loop; say how they differ, or None."""
    made = [_generated(chat, static, items=min(3, step.cache.rows)) for static in (None, step)]
    tolerance = HIDDEN_TOLERANCE.get(chat.gpt.gpt.dtype, 1e-3)
    for item, ((ids, hidden), (static_ids, static_hidden)) in enumerate(zip(*made, strict=True)):
        same = min(len(ids), len(static_ids))
        differs = (ids[:same] != static_ids[:same]).reshape(same, -1).any(1).nonzero()
        compared = int(differs[0]) + 1 if len(differs) else same  # the hidden state that chose the first difference
        if compared == 0 or len(hidden) < compared or len(static_hidden) < compared:
            return f"item {item} made {len(static_hidden)} steps, not {len(hidden)}"
        scale = float(hidden[:compared].abs().max()) or 1.0
        worst = float((hidden[:compared] - static_hidden[:compared]).abs().max()) / scale
        if not worst <= tolerance:  # NaN fails too
            return f"item {item}'s hidden states differ by {worst:.3g} of their largest (at most {tolerance:g})"
    return None


def _generated(chat: Any, static: StaticStep | None, *, items: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    texts = ["一二三四五六七八九十", "你好", "今天天气很好"][:items]  # the shorter are padded on the left; 3 rows to 4
    params = chat.InferCodeParams(show_tqdm=False)
    prompts = chat.speaker.decorate_code_prompts(texts, params.prompt, None, None)
    chat.context.set(False)
    budgets = [CHECK_TOKENS] * len(texts)
    seeds = list(range(1, items + 1))
    first = prepare(chat, prompts, params, seeds=seeds, min_tokens=budgets, max_tokens=budgets, infer_text=False)
    result = generate(chat, first, params, infer_text=False, static=static)
    return list(zip(result.ids, result.hiddens, strict=True))
