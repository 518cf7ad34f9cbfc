"""How far a segment's fragments, joined, are from its whole decode, for each decode window (issue 51).

``python -m bench.fragment_joins [--weights DIR] [--texts N] [--grid default|full] [--out DIR]``

A few sentences of ``bench/corpus_zh.txt`` go through ChatTTS's speech-code pass (``ChatTTSEngine.hidden_states``)
on the CPU; each one's hidden states are decoded whole (``ChatTTSEngine.decode``: the decoder and Vocos), the
reference, and cut into fragments by ``workers.engines.fragments.TokenFragments`` at the default schedule, fed one
token at a time as a decode loop feeds it, once per window (left context, lookahead, crossfade). Each row gives, over
all the sentences, the joined fragments' largest and mean absolute difference from the reference, their SNR, the
largest sample-to-sample jump at a join (beside the reference's largest at the same places) and inside fragments,
the decode work (tokens decoded in all windows ÷ tokens in the segments) and whether the row is equal within 1e-4;
then the cheapest window that is. Random weights (``make full-model``, the default ``models/chattts-random``) are
measured with a fixed token budget so every segment is full length; ``--weights`` on a folder of ChatTTS's real
weights reruns the table on them, and only that says what trained weights need. Writes bench/results/ and
docs/benchmarks/results/fragment-joins.md.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.report import RESULTS, write_run
from devstack.local import ROOT
from workers.engines.base import SynthesisRequest
from workers.engines.chattts import ChatTTSEngine
from workers.engines.chattts_assets import find_weights, read_descriptor
from workers.engines.errors import EngineLoadError
from workers.engines.fragments import (
    SAMPLES_PER_TOKEN,
    Decode,
    FragmentSchedule,
    FragmentSizes,
    Samples,
    TokenFragments,
    Window,
)

#: The largest absolute difference from the whole decode that counts as equal (float32 audio in [-1, 1]).
TOLERANCE = 1e-4
CORPUS = ROOT / "bench" / "corpus_zh.txt"
#: ChatTTS's token lasts 512 samples at 24 kHz.
TOKEN_MS = SAMPLES_PER_TOKEN / 24
#: ChatTTS's decoder (±75 mel frames) and Vocos (about ±29) together see about this many tokens each side: read
#: from their convolutions' kernels and dilations, not measured.
FIELD_TOKENS = 52
CONTEXTS = (0, 2, 4, 8, 16, 32, 52)
LOOKAHEADS = (1, 2, 4, 8, 16, 52)
CROSSFADES = (256, 1024)


def fits(context: int, lookahead: int, crossfade: int = 0) -> Window | None:
    """Return the window, or None where ``Window`` refuses it (a crossfade longer than the lookahead gives)."""
    try:
        return Window(context, lookahead, crossfade)
    except ValueError:
        return None


def full_grid(
    contexts: Iterable[int] = CONTEXTS, lookaheads: Iterable[int] = LOOKAHEADS, crossfades: Iterable[int] = CROSSFADES
) -> list[Window]:
    """Return every context × lookahead × crossfade (0 and ``crossfades``) that makes a window."""
    found = (fits(c, la, f) for c in contexts for la in lookaheads for f in (0, *crossfades))
    return [w for w in found if w is not None]


def default_grid() -> list[Window]:
    """Return the rows that answer the questions without every pair: the diagonal (context = lookahead), windows
    without context, short lookaheads (the latency) under more context (only work), the widest lookahead under
    little context, and crossfades on a few of them (a crossfade trades the previous window's decode of a
    fragment's first samples, short of lookahead, for this one's, short of context)."""
    pairs = [(0, 1), (0, 8), *((n, n) for n in (1, 2, 4, 8, 16, 32, 52))]
    pairs += [(c, la) for la in (1, 2, 4, 8) for c in (8, 16, 52) if c > la]
    pairs += [(c, 52) for c in (0, 4, 16)]
    fades = [(c, la, f) for c, la in ((0, 8), (4, 4), (8, 8), (16, 2), (52, 1)) for f in CROSSFADES]
    found = [fits(c, la) for c, la in pairs] + [fits(c, la, f) for c, la, f in fades]
    return sorted(
        {w for w in found if w is not None}, key=lambda w: (w.crossfade > 0, w.lookahead, w.context, w.crossfade)
    )


@dataclass(frozen=True)
class Joins:
    """One window's fragments against the whole decodes, over every sentence."""

    window: Window
    max_abs: float
    mean_abs: float
    #: 10·log10(Σ reference² / Σ difference²): infinite where the fragments equal the whole decode exactly.
    snr_db: float
    #: The largest |x[j] - x[j-1]| where x[j] opens a fragment (after the first), and the reference's there.
    join_jump: float
    whole_jump_at_joins: float
    #: The largest |x[j] - x[j-1]| inside a fragment.
    inner_jump: float
    #: Tokens decoded in all the windows ÷ tokens in the segments (1.0: each token decoded once).
    work: float
    fragments: int
    joined_samples: int
    whole_samples: int
    decode_s: float

    @property
    def equal(self) -> bool:
        """Say whether the fragments joined are the whole decode within ``TOLERANCE``, at the same length."""
        return self.joined_samples == self.whole_samples and self.max_abs <= TOLERANCE


def cut(hidden: torch.Tensor, sizes: FragmentSizes, window: Window, decode: Decode) -> list[Samples]:
    """Return ``hidden``'s fragments, told its hidden states one token at a time as a decode loop tells them."""
    fragments = TokenFragments(sizes, window, decode)
    made: list[Samples] = []
    for length in range(1, len(hidden)):
        made += fragments.grown(hidden.narrow(0, 0, length))
    return made + fragments.ended(hidden)


def _jumps(joined: Samples, lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Return the indices of ``joined`` where a fragment after the first opens, and where a fragment goes on."""
    starts = np.cumsum([0, *lengths])[1:-1]
    starts = np.unique(starts[(starts > 0) & (starts < len(joined))])
    inside = np.ones(len(joined), dtype=bool)
    inside[0] = False
    inside[starts] = False
    return starts, np.flatnonzero(inside)


def measure(
    hiddens: list[torch.Tensor],
    windows: list[Window],
    decode: Decode,
    sizes: FragmentSizes | None = None,
    progress: Callable[[Joins], None] | None = None,
) -> list[Joins]:
    """Decode each of ``hiddens`` whole, then in fragments through each window; return a row per window (each
    also given to ``progress`` as it is measured)."""
    sizes = sizes or FragmentSchedule().in_tokens(TOKEN_MS)
    wholes = [np.asarray(decode(h), dtype=np.float32) for h in hiddens]
    tokens = sum(len(h) for h in hiddens)
    rows = []
    for window in windows:
        decoded = 0

        def counted(hidden: torch.Tensor) -> Samples:
            nonlocal decoded
            decoded += len(hidden)
            return decode(hidden)

        worst = mean_sum = diff_sq = ref_sq = join_jump = whole_jump = inner_jump = 0.0
        compared = joined_total = fragment_count = 0
        started = time.perf_counter()
        for hidden, whole in zip(hiddens, wholes, strict=True):
            made = cut(hidden, sizes, window, counted)
            joined = np.concatenate(made) if made else np.zeros(0, dtype=np.float32)
            joined_total += len(joined)
            fragment_count += len(made)
            common = min(len(joined), len(whole))
            diff = np.abs(joined[:common].astype(np.float64) - whole[:common])
            if len(joined) != len(whole):
                worst = math.inf
            if common:
                worst = max(worst, float(diff.max()))
            mean_sum += float(diff.sum())
            diff_sq += float(np.square(diff).sum())
            ref_sq += float(np.square(whole[:common].astype(np.float64)).sum())
            compared += common
            starts, inside = _jumps(joined, [len(m) for m in made])
            steps = np.abs(np.diff(joined.astype(np.float64), prepend=0.0))
            whole_steps = np.abs(np.diff(whole.astype(np.float64), prepend=0.0))
            if len(starts):
                join_jump = max(join_jump, float(steps[starts].max()))
                at = starts[starts < len(whole)]
                whole_jump = max(whole_jump, float(whole_steps[at].max()) if len(at) else 0.0)
            if len(inside):
                inner_jump = max(inner_jump, float(steps[inside].max()))
        row = Joins(
            window=window,
            max_abs=worst,
            mean_abs=mean_sum / compared if compared else 0.0,
            snr_db=math.inf if diff_sq == 0 else 10 * math.log10(ref_sq / diff_sq) if ref_sq else -math.inf,
            join_jump=join_jump,
            whole_jump_at_joins=whole_jump,
            inner_jump=inner_jump,
            work=decoded / tokens if tokens else 0.0,
            fragments=fragment_count,
            joined_samples=joined_total,
            whole_samples=sum(len(w) for w in wholes),
            decode_s=time.perf_counter() - started,
        )
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def recommend(rows: list[Joins]) -> Joins | None:
    """Return the cheapest equal row: least context + lookahead, then least lookahead (it delays every fragment,
    the first one's audio included), then least crossfade."""
    equal = [r for r in rows if r.equal]
    return min(equal, key=lambda r: (r.window.context + r.window.lookahead, r.window.lookahead, r.window.crossfade),
               default=None)  # fmt: skip


def quickest(rows: list[Joins]) -> Joins | None:
    """Return the equal row with the least lookahead (the least added latency), then the least context."""
    equal = [r for r in rows if r.equal]
    return min(equal, key=lambda r: (r.window.lookahead, r.window.context, r.window.crossfade), default=None)


def _figure(value: float) -> str:
    return "∞" if math.isinf(value) and value > 0 else f"{value:.2e}" if value else "0"


def _snr(value: float) -> str:
    return "∞ (exact)" if math.isinf(value) and value > 0 else f"{value:.1f}"


def table(rows: list[Joins]) -> str:
    """Return the markdown table, a row per window."""
    lines = [
        "| context | lookahead | crossfade | max abs diff | mean abs diff | SNR (dB) | largest jump at a join "
        "(whole decode there) | largest jump inside | decode work | equal within 1e-4 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        w = r.window
        lines.append(
            f"| {w.context} | {w.lookahead} | {w.crossfade} | {_figure(r.max_abs)} | {_figure(r.mean_abs)} | "
            f"{_snr(r.snr_db)} | {r.join_jump:.4f} ({r.whole_jump_at_joins:.4f}) | {r.inner_jump:.4f} | "
            f"{r.work:.2f}× | {'yes' if r.equal else 'no'} |"
        )
    return "\n".join(lines)


def layer_scales(engine: ChatTTSEngine) -> dict[str, float]:
    """Return the mean |layer scale| of the decoder's and Vocos's ConvNeXt blocks (how much their residual branches,
    which make most of the receptive field, add), where the loaded model has them."""
    chat = engine.chat
    found = {}
    blocks = {
        "decoder": getattr(getattr(getattr(chat, "decoder", None), "decoder", None), "decoder_block", None),
        "Vocos": getattr(getattr(getattr(chat, "vocos", None), "backbone", None), "convnext", None),
    }
    for name, modules in blocks.items():
        scales = [getattr(m, "weight", None) if name == "decoder" else getattr(m, "gamma", None) for m in modules or []]
        values = [s.detach().abs().mean().item() for s in scales if isinstance(s, torch.Tensor)]
        if values:
            found[name] = sum(values) / len(values)
    return found


def document(rows: list[Joins], *, model: str, preset: str | None, texts: list[str], tokens: list[int],
             sizes: FragmentSizes, scales: dict[str, float], wall_s: float,
             busy: float | None = None) -> str:  # fmt: skip
    """Return the markdown: what was measured, the table, the recommended window and what it holds for."""
    best, fastest = recommend(rows), quickest(rows)
    weights = f"random weights ({preset} preset)" if preset else "ChatTTS's weights"
    lines = [
        f"## Fragment joins against the whole decode: {model}, {weights}",
        "",
        f"{len(texts)} sentences of `bench/corpus_zh.txt` ({min(len(t) for t in texts)}–"
        f"{max(len(t) for t in texts)} characters, {sum(tokens)} tokens: {', '.join(map(str, tokens))}), "
        f"each decoded whole (the reference) and in fragments of {sizes.first}, then {sizes.steady} tokens (the "
        f"last at least {sizes.least}), told one token at a time; CPU, {os.cpu_count()} cores, torch threads "
        f"{torch.get_num_threads()}; whole run {wall_s:.0f}s"
        + ("" if busy is None else f" (load average {busy:.1f} at its start)")
        + ". Context and lookahead are in tokens (21.3 ms, "
        "512 samples each), the crossfade in samples; differences are of float32 samples in [-1, 1]. Decode work "
        "is the tokens decoded in all the windows ÷ the tokens in the segments.",
        "",
        table(rows),
        "",
    ]
    if best is None:
        lines.append(f"No window measured is equal to the whole decode within {TOLERANCE:g}.")
    else:
        w = best.window
        lines.append(
            f"**Recommended window on this model:** context {w.context}, lookahead {w.lookahead}, crossfade "
            f"{w.crossfade}: the smallest context + lookahead (then lookahead) equal within {TOLERANCE:g} "
            f"(max abs diff {_figure(best.max_abs)}, decode work {best.work:.2f}×; its lookahead delays each "
            f"fragment, the first included, by {w.lookahead * TOKEN_MS:.0f} ms of tokens)."
        )
        if fastest is not None and fastest.window != w:
            f = fastest.window
            lines.append(
                f"The least lookahead that is equal: context {f.context}, lookahead {f.lookahead}, crossfade "
                f"{f.crossfade} (max abs diff {_figure(fastest.max_abs)}, decode work {fastest.work:.2f}×)."
            )
        else:
            lines.append("No window with less lookahead is equal.")
    lines.append("")
    if scales:
        lines.append(
            "Mean |layer scale| of the ConvNeXt blocks: "
            + ", ".join(f"{name} {value:.2g}" for name, value in scales.items())
            + "."
        )
    lines.append(
        f"ChatTTS's decoder and Vocos see about ±{FIELD_TOKENS} tokens between them, so fragments decoded with "
        f"context and lookahead of {FIELD_TOKENS} should equal the whole decode on any weights, float rounding aside."
    )
    if preset:
        lines[-1] += (
            " These are random weights: their effective receptive field may be smaller than trained weights', so "
            "a window equal here may not be on ChatTTS's weights; rerun with `--weights DIR` on them before taking "
            "a default from this table."
        )
        if scales.get("decoder", 1.0) < 1e-3:
            lines[-1] += (
                " Here the decoder's layer scales are ChatTTS's initial 1e-6: its ConvNeXt blocks, most of the "
                "field, add next to nothing, and what the windows must cover is mostly the vocoder's."
            )
    return "\n".join(lines)


def sentences(count: int, lowest: int = 10, highest: int = 30) -> list[str]:
    """Return ``count`` sentences of the corpus between ``lowest`` and ``highest`` characters, spread over it."""
    lines = [s.strip() for s in CORPUS.read_text(encoding="utf-8").splitlines()]
    fitting = [s for s in lines if lowest <= len(s) <= highest]
    if count > len(fitting):
        raise ValueError(f"the corpus has only {len(fitting)} sentences of {lowest}–{highest} characters")
    return [fitting[i * len(fitting) // count] for i in range(count)]


def random_preset(weights: Path) -> str | None:
    """Return the preset of the random-weight model in ``weights`` (its descriptor, random_weights.json, says
    which), or None for ChatTTS's own weights."""
    try:
        _, root = find_weights(weights)
    except EngineLoadError:
        return None  # loading says what is missing
    descriptor = read_descriptor(root)
    return None if descriptor is None else str(descriptor.get("preset", "tiny"))


def load(weights: Path) -> tuple[ChatTTSEngine, str | None]:
    """Load ChatTTS on the CPU from ``weights`` with ChatTTS's loader, and say which random preset it is (None:
    real weights); random weights make every segment its full token budget, as they stop at random points."""
    preset = random_preset(weights)
    engine = ChatTTSEngine(
        weights_dir=weights,
        device="cpu",
        voices={"default": {"speaker_seed": 2}},
        fixed_token_budget=preset is not None,
    )
    engine.load()
    return engine, preset


def hidden_states(engine: ChatTTSEngine, texts: list[str]) -> list[torch.Tensor]:
    """Return each text's speech-code hidden states, made in one batch, each with its own seed."""
    requests = [SynthesisRequest(text=t, voice="default", seed=i) for i, t in enumerate(texts)]
    return [h.detach().clone() for h in engine.hidden_states(requests)]


def main(argv: list[str] | None = None) -> int:
    """Make the sentences' hidden states, measure every window of the grid, print and write the table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.fragment_joins", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--weights", type=Path, default=ROOT / "models" / "chattts-random")
    parser.add_argument("--texts", type=int, default=6, help="sentences of 10–30 characters (default 6)")
    parser.add_argument("--grid", choices=("default", "full"), default="default",
                        help="full: every context × lookahead × crossfade (several times as long)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    started, busy = time.perf_counter(), os.getloadavg()[0]
    out = args.out / f"fragment-joins-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    engine, preset = load(args.weights)
    texts = sentences(args.texts)
    print(f"{args.weights}: loaded in {time.perf_counter() - started:.0f}s; making {len(texts)} sentences' "
          "hidden states", flush=True)  # fmt: skip
    hiddens = hidden_states(engine, texts)
    print(f"hidden states ({sum(len(h) for h in hiddens)} tokens) by {time.perf_counter() - started:.0f}s", flush=True)
    sizes = FragmentSchedule().in_tokens(TOKEN_MS)
    windows = full_grid() if args.grid == "full" else default_grid()

    def done(row: Joins) -> None:
        w = row.window
        print(f"  context {w.context:2d} lookahead {w.lookahead:2d} crossfade {w.crossfade:4d}: "
              f"max abs diff {_figure(row.max_abs)} ({row.decode_s:.1f}s)", flush=True)  # fmt: skip

    rows = measure(hiddens, windows, engine.decode, sizes, done)
    wall_s = time.perf_counter() - started
    text = document(rows, model=args.weights.name, preset=preset, texts=texts, tokens=[len(h) for h in hiddens],
                    sizes=sizes, scales=layer_scales(engine), wall_s=wall_s, busy=busy)  # fmt: skip
    record: dict[str, Any] = {
        "weights": str(args.weights),
        "random_weights": preset,
        "texts": texts,
        "tokens": [len(h) for h in hiddens],
        "sizes": asdict(sizes),
        "wall_s": wall_s,
        "load_average_at_start": busy,
        "rows": [{**asdict(r), "equal": r.equal} for r in rows],
    }
    write_run(out, "fragment-joins", text, record)
    print()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
