"""ChatTTS's decode step over a static key/value cache, replayed as one CUDA graph per batch bucket where it can be.

On a GPU, a step of ChatTTS's 20-layer Llama is a few hundred small kernels; launched one by one from Python,
the GPU waits on the launches, whatever the batch. A CUDA graph launches them all at once, but replays fixed
addresses and shapes. So the step reads its inputs from buffers made once (the last tokens, positions, the
attention mask, the cache in ``static_cache``), a batch is padded to the next bucket of rows, and each bucket's
step is captured once at load. The step is ChatTTS's own: its code embeddings summed, its Llama, its
weight-normed code heads. Sampling stays outside the graph, in the per-item sampler: its state is per item and
changes every step, and sampling replayed inside a graph has garbled other servers' audio.

Before a graph serves, it is checked against the same step run eagerly on a probe batch; one that differs,
or fails to capture, is dropped and the step runs eagerly (``Graphs.path`` says which serves). On a CPU
nothing is captured: the same buffers run eagerly, which is what the tests check against the growing loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional

from workers.engines.static_cache import StaticCache

log = logging.getLogger(__name__)

#: The batch sizes a graph is captured for (up to the cache's rows): a batch runs in the next one up.
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
#: Graphs are also captured per width, in steps of this many columns: a step attends over the next width up, not
#: the whole cache (at batch 64, reading every column of every layer would cost more than the weights).
WIDTH_STEP = 128

#: (hidden states of the bucket's rows, in fp32; their logits, num_vq rows per item, before temperature).
StepOutput = tuple[torch.Tensor, torch.Tensor]
#: What makes a graph of a step: given the step's code, return its replay (``cuda_graphs``).
Capture = Callable[[Callable[[], StepOutput]], Callable[[], StepOutput]]


@dataclass(frozen=True)
class ProbeResult:
    """What checking a bucket's graph (rows, columns) against the eager step found."""

    bucket: tuple[int, int]
    ok: bool
    detail: str


class StaticStep:
    """One decode step of ChatTTS's GPT over buffers that never move, eager or replayed from a graph per bucket."""

    def __init__(self, gpt: Any, cache: StaticCache, *, buckets: Sequence[int] = BUCKETS) -> None:
        self.gpt, self.cache = gpt, cache
        rows, device = cache.rows, gpt.device_gpt
        self.buckets = sorted({b for b in buckets if b < rows} | {rows})
        self.widths = sorted({*range(WIDTH_STEP, cache.positions, WIDTH_STEP), cache.positions})
        self.tokens = torch.zeros(rows, 1, gpt.num_vq, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.mask = torch.ones(rows, cache.positions, dtype=torch.bool, device=device)
        # The heads' weight norm, once: a graph must read weights that stay where they are.
        self.head_weights = [getattr(head, "__self__", head).weight.detach().clone() for head in gpt.head_code]
        self.graphs: dict[tuple[int, int], Callable[[], StepOutput]] = {}
        self.outgrown = 0  # calls that did not fit, and ran on the growing loop

    def bucket(self, rows: int, columns: int) -> tuple[int, int]:
        """Return the bucket (rows, width) a step of ``rows`` rows over ``columns`` columns runs in."""
        return next(b for b in self.buckets if b >= rows), next(w for w in self.widths if w >= columns)

    def note_outgrown(self, rows: int, columns: int) -> None:
        """Count a call of ``rows`` rows and ``columns`` columns that does not fit; log the first."""
        self.outgrown += 1
        if self.outgrown == 1:
            log.warning("a call of %d rows over %d columns does not fit the static cache (%d × %d): it runs on the "
                        "growing loop; raise static_rows or static_positions if this is common", rows, columns,
                        self.cache.rows, self.cache.positions)  # fmt: skip

    def compute(self, active: int, width: int) -> StepOutput:
        """Run the step on the first ``active`` rows, attending over ``width`` columns (what a graph captures)."""
        gpt = self.gpt
        self.cache.reach.active, self.cache.reach.width = active, width
        tokens = self.tokens.narrow(0, 0, active)
        codes = [gpt.emb_code[q](tokens[:, :, q]) for q in range(gpt.num_vq)]
        embedded = torch.stack(codes, 3).sum(3).to(gpt.gpt.dtype)
        mask = self.mask.narrow(0, 0, active).narrow(1, 0, width)[:, None, None, :]
        outputs = gpt.gpt(
            attention_mask=mask,
            position_ids=self.positions.narrow(0, 0, active),
            past_key_values=self.cache,
            inputs_embeds=embedded,
            use_cache=True,
            output_attentions=False,
        )
        hidden = outputs.last_hidden_state.narrow(1, -1, 1).squeeze(1).to(gpt.device, dtype=torch.float)
        logits = torch.stack([functional.linear(hidden, w) for w in self.head_weights], 1).float()
        return hidden, logits.reshape(-1, gpt.num_audio_tokens)

    def run(self, last: torch.Tensor, mask: torch.Tensor) -> StepOutput:
        """Step the rows in use: ``last`` their last tokens (rows, num_vq), ``mask`` their filled columns.

        Returns their hidden states and logits (copies: a graph's outputs are overwritten by its next replay).
        """
        cache, used = self.cache, self.cache.used
        length = mask.size(1)  # the cache's filled columns and the one this step writes
        if (used, length - 1) != (last.size(0), cache.length):
            raise RuntimeError(f"the static cache holds {used} rows of {cache.length} columns, not the "
                               f"{last.size(0)} of {length - 1} the loop has")  # fmt: skip
        bucket = self.bucket(used, length)
        replay = self.graphs.get(bucket)
        active, width = bucket if replay is not None else (used, length)
        self.tokens.narrow(0, 0, used).copy_(last.unsqueeze(1))
        rows = self.mask.narrow(0, 0, used)
        if width > length:
            rows.narrow(1, length, width - length).fill_(False)
        self.mask.narrow(0, used, active - used).fill_(True)  # padding rows: finite, ignored
        rows.narrow(1, 0, length).copy_(mask)
        self.positions.narrow(0, 0, used).copy_(mask.sum(1, keepdim=True) - 1)
        cache.aim()
        hidden, logits = replay() if replay is not None else self.compute(active, width)
        cache.advance()
        return hidden.narrow(0, 0, used).clone(), logits.narrow(0, 0, used * self.gpt.num_vq).clone()


class Graphs:
    """Capture a ``StaticStep``'s graphs (CUDA only), check each against the eager step, and say what serves."""

    def __init__(self, step: StaticStep, *, tolerance: float) -> None:
        self.step = step
        self.tolerance = tolerance  # largest logit difference allowed (0 in fp32: the same tokens are enough)
        self.probes: list[ProbeResult] = []
        self.failure: str | None = None

    @property
    def path(self) -> str:
        """Say which path serves a decode step."""
        if not self.step.graphs:
            why = f": {self.failure}" if self.failure else ""
            return f"static cache, eager step{why}"
        rows = sorted({b for b, _ in self.step.graphs})
        widths = sorted({w for _, w in self.step.graphs})
        return (f"static cache, CUDA graphs for batch buckets {','.join(map(str, rows))} "
                f"× widths {','.join(map(str, widths))}")  # fmt: skip

    @torch.inference_mode()
    def capture(self, capture: Capture) -> None:
        """Capture each bucket with ``capture`` (a graph maker); keep them if each probe finds it equal to eager."""
        step = self.step
        for bucket in ((rows, width) for rows in step.buckets for width in step.widths):
            try:
                replay = capture(lambda b=bucket: step.compute(*b))  # type: ignore[misc]
                result = self.probe(bucket, replay)
            except Exception as e:  # a capture that fails leaves the step eager: never a worker that cannot start
                self._give_up(f"capturing bucket {bucket} failed: {type(e).__name__}: {e}")
                return
            self.probes.append(result)
            if not result.ok:
                self._give_up(f"bucket {bucket}'s graph differs from the eager step: {result.detail}")
                return
            step.graphs[bucket] = replay

    def _give_up(self, why: str) -> None:
        """Drop every graph: the step runs eagerly, and the log and ``path`` say ``why``."""
        self.failure = why
        log.warning("CUDA graphs off, the step runs eagerly: %s", why)
        self.step.graphs.clear()

    @torch.inference_mode()
    def probe(self, bucket: tuple[int, int], replay: Callable[[], StepOutput]) -> ProbeResult:
        """Run a probe batch of ``bucket``'s rows and width through ``replay`` and eagerly; say whether they agree."""
        step, cache = self.step, self.step.cache
        rows, width = bucket
        generator = torch.Generator(device="cpu").manual_seed(rows * width)
        column = width - 1 - rows % 8  # the last columns the width holds, where a step over it may write
        tokens = torch.randint(0, self.step.gpt.num_audio_tokens, step.tokens.narrow(0, 0, rows).shape,
                               generator=generator)  # fmt: skip
        step.tokens.narrow(0, 0, rows).copy_(tokens)
        step.mask.narrow(0, 0, rows).fill_(False).narrow(1, 0, column + 1).fill_(True)
        step.positions.narrow(0, 0, rows).fill_(column)
        cache.reach.column.fill_(column)
        _, eager_logits = (t.clone() for t in step.compute(rows, width))
        _, graph_logits = replay()
        if not torch.isfinite(graph_logits).all():
            return ProbeResult(bucket, False, "the graph's logits are not finite")
        same_tokens = bool(torch.equal(eager_logits.argmax(-1), graph_logits.argmax(-1)))
        worst = float((eager_logits - graph_logits).abs().max())
        ok = same_tokens if self.tolerance == 0 else worst <= self.tolerance
        return ProbeResult(bucket, ok, f"largest logit difference {worst:.3g}, same tokens: {same_tokens}")


def cuda_graphs(device: torch.device) -> Capture:
    """Return a maker of CUDA graphs on ``device`` that share one memory pool (a step's graphs never run at once,
    and each replay's outputs are copied before the next)."""
    with torch.cuda.device(device):
        pool = torch.cuda.graph_pool_handle()

    def capture(compute: Callable[[], StepOutput]) -> Callable[[], StepOutput]:
        # Streams on the step's own device: on cuda:1 a capture on the current device's stream records nothing.
        with torch.cuda.device(device):
            warm, capturing = torch.cuda.Stream(device), torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            warm.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(warm):
                for _ in range(2):  # the warm-up runs allocate what capture must not (cuBLAS workspaces, caches)
                    compute()
            torch.cuda.current_stream(device).wait_stream(warm)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=capturing):
                outputs = compute()

        def replay() -> StepOutput:
            graph.replay()
            return outputs

        return replay

    return capture


#: The largest logit difference between a graph and the eager step that still serves, by the Llama's dtype.
TOLERANCE = {torch.float32: 0.0, torch.float16: 5e-2, torch.bfloat16: 1e-1}
GRAPH_MODES = ("auto", "on", "off")
#: The most of a GPU's free memory the static cache may take at load: the rest is for activations and decoding.
FREE_SHARE = 0.5


def prepared_step(
    gpt: Any, *, mode: str, rows: int, positions: int, capture: Capture | None = None
) -> tuple[StaticStep | None, str]:
    """Return the static step ``mode`` asks for on ``gpt``'s device (graphs captured and checked), and what serves.

    ``off``: none (the growing loop). ``auto``: on CUDA, graphs; on a CPU none, where the growing loop is the
    faster (``make bench-engine``'s static-step table). ``on``: the static step everywhere, graphed on CUDA.
    ``capture`` makes a graph (default: ``cuda_graphs`` on CUDA, none elsewhere).
    """
    if mode not in GRAPH_MODES:
        raise ValueError(f"graphs must be one of {GRAPH_MODES}, not {mode!r}")
    device = torch.device(gpt.device_gpt)
    cuda = device.type == "cuda"
    if cuda and device.index is None:  # plain "cuda": the current GPU, named (memory and streams ask which)
        device = torch.device("cuda", torch.cuda.current_device())
    if mode == "off" or (mode == "auto" and not cuda):
        return None, f"growing cache, eager step (graphs {mode}{'' if cuda else ', no GPU'})"
    attention = getattr(gpt.gpt.config, "_attn_implementation", None)
    if attention != "sdpa":  # the step's boolean mask means "attend" to SDPA only; eager attention would add it
        return None, f"growing cache, eager step (the static step needs SDPA attention, not {attention})"
    dtype = gpt.gpt.dtype
    need = StaticCache.bytes_for(gpt.gpt.config, rows=rows, positions=positions, dtype=dtype)
    free = torch.cuda.mem_get_info(device)[0] if cuda else None
    if free is not None and need > free * FREE_SHARE:
        too_big = (
            f"a static cache of {need / 2**20:.0f} MiB is over {FREE_SHARE:.0%} of the {free / 2**20:.0f} MiB free"
        )
        return None, f"growing cache, eager step ({too_big}: lower static_rows or static_positions)"
    cache = StaticCache(gpt.gpt.config, rows=rows, positions=positions, dtype=dtype, device=device)
    step = StaticStep(gpt, cache)
    capture = capture or (cuda_graphs(device) if cuda else None)
    if capture is None:
        return step, "static cache, eager step (no GPU to capture graphs on)"
    graphs = Graphs(step, tolerance=TOLERANCE.get(dtype, 0.0))
    graphs.capture(capture)
    return step, graphs.path
