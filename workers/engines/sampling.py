"""Pick each batch item's next audio token on its own, cheaply: ChatTTS's sampling, fused and per item.

ChatTTS samples a whole batch from one generator, so an item's tokens would depend on its place
in the batch; and its logits pipeline (a repetition penalty that builds a one-hot tensor of the
last 16 tokens over the whole vocabulary, then top-p by a full sort, then top-k) costs, on a small
model, more than the model's own forward pass, and grows with the batch. ``PerItemSampler`` keeps
the same distribution (the tokens top-p and top-k keep, with the same probabilities) but works
on the ``top_k`` best candidates only, and draws each item's noise from that item's own seeded
generator, a block of steps at a time. Put as ChatTTS's only logits processor, it returns one-hot
logits that ChatTTS's own sampling can only follow.
"""

from __future__ import annotations

import math

import torch

#: ChatTTS's repetition penalty looks at this many of the latest tokens.
PENALTY_WINDOW = 16
#: Top-p and top-k keep at least this many candidates (as ChatTTS asks of its warpers).
MIN_KEEP = 3
#: Steps of noise drawn at once from each item's generator.
NOISE_BLOCK = 32


class PerItemSampler:
    """Sample each row from the top-p ∩ top-k candidates of its penalised logits, with per-item noise."""

    def __init__(
        self,
        *,
        seeds: list[int],
        rows_per_item: int,
        eos_token: int,
        min_tokens: list[int],
        max_tokens: list[int],
        device: torch.device,
        top_p: float | None = 0.7,
        top_k: int | None = 20,
        repetition_penalty: float = 1.0,
    ) -> None:
        self._generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
        self._rows = rows_per_item
        self._eos = eos_token
        self._min = torch.tensor(min_tokens, device=device).repeat_interleave(rows_per_item)
        self._max = torch.tensor(max_tokens, device=device).repeat_interleave(rows_per_item)
        self._top_p = top_p
        self._top_k = top_k
        self._penalty = repetition_penalty
        self._steps = [0] * len(seeds)  # each item's own step: items may join a generation already running
        self._noise: list[torch.Tensor | None] = [None] * len(seeds)  # per item: (NOISE_BLOCK, rows, candidates)

    def __len__(self) -> int:
        """Return the number of items this sampler still samples for."""
        return len(self._generators)

    def __call__(self, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Return logits that allow only the token sampled for each row (``input_ids``: tokens generated so far)."""
        chosen = self.sample(input_ids, logits)
        return torch.full(logits.shape, -math.inf, device=logits.device).scatter_(1, chosen.unsqueeze(1), 0.0)

    def sample(self, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Return the token sampled for each row at its item's next step.

        ``input_ids`` holds each row's latest tokens, oldest first; of them, only as many as the row's item has
        generated are its history (a row whose item joined late may be given prompt tokens before them).
        """
        steps = self._row_steps(logits.device)
        candidates, probs = self.distribution(input_ids, logits, steps)
        # The exponential race torch.multinomial itself uses for one sample, one noise stream per item.
        pick = (probs / self._noise_now(probs.size(1), logits.device)).argmax(dim=1, keepdim=True)
        chosen = candidates.gather(1, pick).squeeze(1)
        self._steps = [step + 1 for step in self._steps]
        return chosen.masked_fill(self._max <= steps, self._eos)

    def retain(self, items: torch.Tensor) -> None:
        """Keep only the items at positions ``items`` (of those still kept), in that order.

        Each item's noise comes from its own generator, so the kept items sample exactly as they would have.
        """
        rows = (items.unsqueeze(1) * self._rows + torch.arange(self._rows, device=items.device)).reshape(-1)
        kept = [int(i) for i in items]
        self._generators = [self._generators[i] for i in kept]
        self._steps = [self._steps[i] for i in kept]
        self._noise = [self._noise[i] for i in kept]
        self._min = self._min.index_select(0, rows.to(self._min.device))
        self._max = self._max.index_select(0, rows.to(self._max.device))

    def extend(self, other: PerItemSampler) -> None:
        """Take on ``other``'s items after this one's, each at its own step (items joining a running generation)."""
        if (other._rows, other._eos, other._top_p, other._top_k, other._penalty) != (
            self._rows, self._eos, self._top_p, self._top_k, self._penalty,
        ):  # fmt: skip
            raise ValueError("only items sampled with the same settings can join a generation")
        self._generators += other._generators
        self._steps += other._steps
        self._noise += other._noise
        self._min = torch.cat([self._min, other._min.to(self._min.device)])
        self._max = torch.cat([self._max, other._max.to(self._max.device)])

    def distribution(
        self, input_ids: torch.Tensor, logits: torch.Tensor, steps: int | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return each row's candidate tokens and their probabilities (zero for those top-p drops).

        ``steps``: how many tokens each row (or every row) has generated; the last that many of ``input_ids``.
        """
        steps = torch.as_tensor(steps, device=logits.device)
        logits = self._penalise(input_ids, logits.float(), steps)
        k = logits.size(1) if self._top_k is None else max(MIN_KEEP, min(self._top_k, logits.size(1)))
        values, candidates = torch.topk(logits, k, dim=1)  # descending
        keep = self._top_p_mask(logits, values)
        keep &= ~((candidates == self._eos) & (self._min > steps).unsqueeze(1))  # no end before the minimum
        return candidates, torch.softmax(values.masked_fill(~keep, -math.inf), dim=1)

    def _row_steps(self, device: torch.device) -> torch.Tensor:
        steps = torch.tensor(self._steps, device=device)
        return steps if self._rows == 1 else steps.repeat_interleave(self._rows)

    def _penalise(self, input_ids: torch.Tensor, logits: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        # ChatTTS's CustomRepetitionPenaltyLogitsProcessorRepeat, on the window's tokens only: a token's logit is
        # scaled by penalty ** (how often it is in the row's window), which leaves every other token as it is. So
        # the count is taken within the window (its width squared per row) and only those logits are rewritten,
        # instead of a count and a scaling over the whole vocabulary per row, a cost that grew with the batch (the
        # same logits, tested against ChatTTS's own processor).
        if self._penalty == 1.0 or input_ids.size(1) == 0:
            return logits
        window = input_ids[:, -PENALTY_WINDOW:].to(logits.device)
        # A row's window holds only its own tokens: the last ``steps`` of it. The earlier ones are its prompt's
        # text tokens, whose ids run past the audio vocabulary: they are not counted, and point at token 0 (whose
        # logit they then rewrite to the value its own count gives it, as an entry of its own would).
        width = window.size(1)
        own = (torch.arange(width, device=logits.device) >= width - steps.view(-1, 1)).expand(window.size(0), -1)
        window = window.masked_fill(~own, 0)
        counts = ((window.unsqueeze(2) == window.unsqueeze(1)) & own.unsqueeze(1)).sum(2)
        picked = logits.gather(1, window)
        alpha = torch.pow(self._penalty, counts.to(logits.dtype))
        penalised = torch.where(picked < 0, picked * alpha, picked / alpha)
        return logits.clone().scatter_(1, window, penalised)

    def _top_p_mask(self, logits: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        # transformers' TopPLogitsWarper keeps a token while the probability of all tokens ranked
        # above it is below top_p: computed on the top-k only, with the full vocabulary's normaliser.
        if self._top_p is None or self._top_p >= 1.0:
            return torch.ones_like(values, dtype=torch.bool)
        probs = torch.exp(values - torch.logsumexp(logits, dim=1, keepdim=True))
        above = torch.cumsum(probs, dim=1) - probs
        keep = above < self._top_p
        keep[:, :MIN_KEEP] = True
        return keep

    def _noise_now(self, k: int, device: torch.device) -> torch.Tensor:
        """Return this step's noise per row: each item's from its own generator, a block of its steps at a time."""
        rows = []
        for item, (step, generator) in enumerate(zip(self._steps, self._generators, strict=True)):
            block = self._noise[item]
            if step % NOISE_BLOCK == 0 or block is None:
                block = torch.empty((NOISE_BLOCK, self._rows, k), device=device).exponential_(generator=generator)
                self._noise[item] = block
            rows.append(block[step % NOISE_BLOCK])
        return torch.cat(rows) if len(rows) > 1 else rows[0]
