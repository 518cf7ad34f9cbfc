"""ChatTTS's token-by-token loop, with each item dropped from the batch the step it ends.

ChatTTS's own ``GPT.generate`` runs every row of a batch until the longest item ends: a batch of
one 100-character segment and fifteen 10-character ones pays sixteen rows for the whole length of
the long one. Here an item leaves the batch (its rows of the key/value cache, the inputs, the
sampler's state) at the step it ends, so each step costs what is still being made. Every other
step is ChatTTS's: the same input preparation (its own ``_prepare_generation_inputs``), the same
model call, heads, temperature and end rule; the tokens come from the per-item sampler, whose
noise is per item, so what an item says does not depend on when its batch mates end.

Items may also join a generation already running (``joins``): the loop asks between steps, runs the
newcomers' prompts through the model on their own, and then carries them in the same batch, every
row's key/value cache, tokens and mask moved so that all rows end at the same position (the shorter
ones padded on the left, which the attention mask hides and the positions, counted from the mask,
ignore). A segment that arrives while a call runs need not wait for the whole call to end.

It needs the key/value cache: a model without one (ChatTTS's TransformerEngine Llama, vLLM) goes
through ChatTTS's own loop instead (``supports``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.utils import parametrize

from workers.engines.kv_cache import drop_front, growing_cache, joined_cache, shifted_stack
from workers.engines.sampling import PENALTY_WINDOW, PerItemSampler
from workers.engines.static_cache import StaticCache
from workers.engines.static_step import StaticStep

#: Told an item's output the step it ends: (its index in the batch, its tokens, its hidden states or None).
Finished = Callable[[int, torch.Tensor, torch.Tensor | None], None]
#: Told after each step, for each item still running, its hidden states so far: (its index, hidden states). The view
#: is valid only during the call (the next step writes on).
Grown = Callable[[int, torch.Tensor], None]


@dataclass
class Generated:
    """Per item, in input order (joined items after the first batch's): its tokens and, if asked, its hidden states."""

    ids: list[torch.Tensor]
    hiddens: list[torch.Tensor]


@dataclass
class Joining:
    """Items to add to a running generation: their prompts as ``generate`` takes them, and their own sampler."""

    emb: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    sampler: PerItemSampler
    max_new_token: int


#: Asked between steps for items to add to the generation (None: none now).
Joins = Callable[[], Joining | None]


def supports(gpt: Any) -> bool:
    """Whether ``gpt`` (ChatTTS's GPT) can run this loop: a plain Llama with its key/value cache on."""
    return not getattr(gpt, "is_vllm", False) and not gpt.is_te_llama and gpt.enable_cache


def generate(
    gpt: Any,
    emb: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: torch.Tensor,
    sampler: PerItemSampler,
    eos_token: int,
    max_new_token: int,
    infer_text: bool,
    return_hidden: bool,
    interrupted: Callable[[], bool] = lambda: False,
    finished: Finished | None = None,
    joins: Joins | None = None,
    grown: Grown | None = None,
    static: StaticStep | None = None,
) -> Generated:
    """Generate up to ``max_new_token`` tokens per item; an item ends at the first end token in any of its rows.

    ``emb`` is the prompt's embedding (speaker applied), ``input_ids`` the prompt's ids (batch, length,
    num_vq) and ``attention_mask`` its padding mask, as ChatTTS's tokenizer makes them. ``finished`` is told
    each item's output (its index, tokens and hidden states) at the step the item ends, before the rest go on.
    ``joins`` is asked between steps for more items; theirs are numbered after the items already taken.
    ``grown`` is told after each step each running item's hidden states so far (with ``return_hidden``), so that
    its audio can be made while it runs. With ``static`` (speech codes only), the steps after the prompt's run over
    its static cache (``static_step``) for as long as the generation fits in it: in fp32 on a CPU exactly the same
    tokens; padded to a bucket, a GPU's reductions may round differently.
    """
    if static is not None and infer_text:
        raise ValueError("the static step runs the speech-code pass only (its embeddings and heads are the codes')")
    out = _Outputs(finished)
    step = functools.partial(_step, temperature=temperature, eos_token=eos_token)
    rows = _Rows(gpt, input_ids, attention_mask, max_new_token, out, infer_text=infer_text, return_hidden=return_hidden)
    # The heads' weight norm is computed once for the whole loop, not once per step.
    with parametrize.cached():
        ended = step(rows, sampler, emb)
        if static is not None:
            rows.settle(static)
        while True:
            stop = interrupted()
            running = rows.finish(ended, stop=stop)
            if stop:
                break
            if len(running) < len(sampler):
                sampler.retain(running)
            if rows.size == 0:
                break  # a segment arriving now starts a call of its own
            if grown is not None:
                rows.grew(grown)
            joining = joins() if joins is not None else None
            if joining is not None:
                newcomers = _Rows(gpt, joining.input_ids, joining.attention_mask, joining.max_new_token, out,
                                  infer_text=infer_text, return_hidden=return_hidden)  # fmt: skip
                started = newcomers.finish(step(newcomers, joining.sampler, joining.emb), stop=False)
                if len(started) < len(joining.sampler):
                    joining.sampler.retain(started)
                rows.join(newcomers)
                sampler.extend(joining.sampler)
            ended = step(rows, sampler, None)
    return out.generated(infer_text=infer_text, return_hidden=return_hidden, width=input_ids.size(2), gpt=gpt)


def _step(
    rows: _Rows, sampler: PerItemSampler, emb: torch.Tensor | None, *, temperature: torch.Tensor, eos_token: int
) -> torch.Tensor:
    """Run one step (the prompt's, with ``emb``, or the last tokens'); return which rows ended."""
    logits = rows.forward(emb)
    chosen = sampler.sample(rows.window(), rows.tempered(logits, temperature))
    return rows.record(chosen, eos_token)


class _Outputs:
    """Each item's output, by item index, as its rows end."""

    def __init__(self, finished: Finished | None) -> None:
        self.ids: list[torch.Tensor | None] = []
        self.hiddens: list[torch.Tensor | None] = []
        self.finished = finished

    def take(self, count: int) -> torch.Tensor:
        """Number ``count`` more items; return their indices."""
        first = len(self.ids)
        self.ids += [None] * count
        self.hiddens += [None] * count
        return torch.arange(first, first + count)

    def put(self, item: int, ids: torch.Tensor, hiddens: torch.Tensor | None) -> None:
        self.ids[item], self.hiddens[item] = ids, hiddens
        if self.finished is not None:
            self.finished(item, ids, hiddens)

    def generated(self, *, infer_text: bool, return_hidden: bool, width: int, gpt: Any) -> Generated:
        """Return every item's output, in item order."""
        no_ids = torch.zeros(0, *(() if infer_text else (width,)), dtype=torch.long)
        no_hidden = torch.zeros(0, gpt.gpt.config.hidden_size, device=gpt.device)
        return Generated(
            ids=[t if t is not None else no_ids for t in self.ids],
            hiddens=[h if h is not None else no_hidden for h in self.hiddens] if return_hidden else [],
        )


class _Rows:
    """The rows of a generation by position: prompts (left-padded), tokens so far, the key/value cache.

    Every row has ``length`` positions filled (its last token is the next step's input); a row's own tokens
    start at ``begin`` and may run until ``end``.
    """

    def __init__(
        self,
        gpt: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        max_new_token: int,
        out: _Outputs,
        *,
        infer_text: bool,
        return_hidden: bool,
    ) -> None:
        self.gpt = gpt
        self.infer_text = infer_text
        self.return_hidden = return_hidden
        self.out = out
        batch, self.length, width = input_ids.shape
        self.capacity = self.length + max_new_token
        self.ids = torch.zeros(batch, self.capacity, width, dtype=input_ids.dtype, device=input_ids.device)
        self.ids.narrow(1, 0, self.length).copy_(input_ids)
        self.mask = torch.ones(batch, self.capacity, dtype=torch.bool, device=input_ids.device)
        self.mask.narrow(1, 0, attention_mask.size(1)).copy_(attention_mask)
        self.begin = torch.full((batch,), self.length)
        self.end = self.begin + max_new_token
        self.items = out.take(batch)  # the item index of each row
        self.hiddens: torch.Tensor | None = None
        self.past: Any = None
        self.static: StaticStep | None = None  # set while the rows run on a static cache

    @property
    def size(self) -> int:
        """Return the number of rows still running."""
        return int(self.items.numel())

    def settle(self, static: StaticStep) -> None:
        """Move the rows onto ``static``'s cache, if they fit, for the steps that follow."""
        if not self.size:
            return
        if not static.cache.fits(self.size, self.capacity):
            static.note_outgrown(self.size, self.capacity)
            return
        self.past = static.cache.take(self.past, self.size, self.length - 1)
        self.static = static

    def _unsettle(self) -> None:
        """Move the rows back onto a growing cache (the generation outgrew the static one)."""
        assert isinstance(self.past, StaticCache) and self.static is not None
        self.static.note_outgrown(self.size, self.capacity)
        self.past, self.static = self.past.grown_copy(self.gpt.gpt.config, self.capacity), None

    def forward(self, emb: torch.Tensor | None) -> torch.Tensor:
        """Run the model on the prompt (``emb``) or the last tokens; return each row's logits (before temperature)."""
        if emb is None and self.static is not None:
            last = self.ids[:, self.length - 1].to(self.gpt.device_gpt)
            stepped, logits = self.static.run(last, self.mask.narrow(1, 0, self.length).to(self.gpt.device_gpt))
            self._keep_hidden(stepped)
            return logits
        gpt = self.gpt
        model_input = gpt._prepare_generation_inputs(
            self.ids.narrow(1, 0, self.length), self.past, self.mask.narrow(1, 0, self.length)
        )
        if emb is not None:
            model_input.inputs_embeds = emb
        else:
            last = model_input.input_ids.to(gpt.device_gpt)
            if self.infer_text:
                model_input.inputs_embeds = gpt.emb_text(last[:, :, 0])
            else:
                codes = [gpt.emb_code[q](last[:, :, q]).to(gpt.device) for q in range(gpt.num_vq)]
                model_input.inputs_embeds = torch.stack(codes, 3).sum(3)
            model_input.input_ids = None
        # ChatTTS casts every input to the Llama's dtype, positions too; in half precision that rounds them (bf16
        # holds integers exactly only to 256, fp16 to 2048), so they go to the device as the integers they are.
        positions, cache_position = model_input.position_ids, model_input.cache_position
        model_input.position_ids = model_input.cache_position = None  # its cast skips what is None
        model_input.to(gpt.device_gpt, gpt.gpt.dtype)
        outputs = gpt.gpt(
            attention_mask=model_input.attention_mask,
            position_ids=positions.to(gpt.device_gpt),
            # The first step starts a cache that grows in place, not by copying itself each step (kv_cache).
            past_key_values=self.past if self.past is not None else growing_cache(gpt.gpt.config, self.capacity),
            inputs_embeds=model_input.inputs_embeds,
            use_cache=True,
            output_attentions=False,
            cache_position=cache_position.to(gpt.device_gpt),
        )
        self.past = outputs.past_key_values
        hidden: torch.Tensor = outputs.last_hidden_state.narrow(1, -1, 1).squeeze(1).to(gpt.device, dtype=torch.float)
        self._keep_hidden(hidden)
        if self.infer_text:
            return gpt.head_text(hidden).float()  # type: ignore[no-any-return]
        return torch.stack([head(hidden) for head in gpt.head_code], 1).float().reshape(-1, gpt.num_audio_tokens)

    def _keep_hidden(self, hidden: torch.Tensor) -> None:
        if self.return_hidden:
            if self.hiddens is None:
                self.hiddens = torch.zeros(hidden.size(0), self.capacity, hidden.size(1), device=self.gpt.device)
            self.hiddens[:, self.length] = hidden  # the hidden state the token at this position is sampled from

    def tempered(self, logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
        """Return the rows' logits (an item's num_vq rows together) divided by temperature."""
        rows = temperature.to(logits.device).view(1, -1).expand(self.size, -1).reshape(-1, 1)
        return logits / rows

    def window(self) -> torch.Tensor:
        """Return each sampled row's latest tokens: what the repetition penalty reads (the sampler knows its own)."""
        width = min(PENALTY_WINDOW, self.length)
        latest = self.ids.narrow(1, self.length - width, width)
        window = latest[:, :, 0] if self.infer_text else latest.permute(0, 2, 1).reshape(-1, width)
        return window.to(self.gpt.device)

    def record(self, chosen: torch.Tensor, eos_token: int) -> torch.Tensor:
        """Store this step's tokens; return which rows ended (an end token in any of an item's rows)."""
        chosen = chosen.to(self.ids.device)
        if self.infer_text:
            self.ids[:, self.length] = chosen.unsqueeze(1).expand(-1, self.ids.size(2))
            ended = chosen.eq(eos_token)
        else:
            chosen = chosen.view(-1, self.gpt.num_vq)
            self.ids[:, self.length] = chosen
            ended = chosen.eq(eos_token).any(1)
        self.length += 1
        return ended

    def finish(self, ended: torch.Tensor, *, stop: bool) -> torch.Tensor:
        """Hand over the items of ended rows (and of all, if ``stop``); keep the rest; return the kept positions.

        An item's output stops before its end token; one that reached its last position, or is stopped, keeps it all.
        """
        ended = ended.cpu()
        full = self.length >= self.end
        done = ended | full | stop
        for position in done.nonzero().squeeze(1).tolist():
            begin = int(self.begin[position])
            count = self.length - begin - (1 if bool(ended[position]) else 0)
            tokens = self.ids[position].narrow(0, begin, count)
            hiddens = None if self.hiddens is None else self.hiddens[position].narrow(0, begin, count).clone()
            own = tokens[:, 0].clone() if self.infer_text else tokens.clone()
            self.out.put(int(self.items[position]), own, hiddens)
        keep = (~done).nonzero().squeeze(1)
        if keep.numel() < self.size:
            self._retain(keep)
            self._trim()
        return keep

    def grew(self, grown: Grown) -> None:
        """Tell ``grown`` each running item's hidden states so far (its own positions only)."""
        if self.hiddens is None:
            return
        for position, (item, begin) in enumerate(zip(self.items.tolist(), self.begin.tolist(), strict=True)):
            grown(item, self.hiddens[position].narrow(0, begin, self.length - begin))

    def _trim(self) -> None:
        """Drop the leading positions that are padding for every row left: a call that others joined and left
        would otherwise carry (and attend over) the length of everything it ever ran."""
        if self.size == 0 or self.past is None:
            return
        filled = self.mask.narrow(1, 0, self.length)
        unused = int(filled.to(torch.uint8).argmax(dim=1).min())  # the earliest first position any row uses
        if unused < PENALTY_WINDOW:  # a few positions are not worth the bookkeeping
            return
        if isinstance(self.past, StaticCache):
            self.past.drop_front(unused)
        else:
            drop_front(self.past, unused)
        self.ids = self.ids.narrow(1, unused, self.capacity - unused)
        self.mask = self.mask.narrow(1, unused, self.capacity - unused)
        if self.hiddens is not None:
            self.hiddens = self.hiddens.narrow(1, unused, self.capacity - unused)
        self.begin -= unused
        self.end -= unused
        self.length -= unused
        self.capacity -= unused

    def _retain(self, keep: torch.Tensor) -> None:
        self.items = self.items.index_select(0, keep)
        self.begin = self.begin.index_select(0, keep)
        self.end = self.end.index_select(0, keep)
        if keep.numel() and self.past is not None:
            self.past.batch_select_indices(keep.to(self.gpt.device_gpt))
        self.ids = self.ids.index_select(0, keep.to(self.ids.device))
        self.mask = self.mask.index_select(0, keep.to(self.mask.device))
        if self.hiddens is not None:
            self.hiddens = self.hiddens.index_select(0, keep.to(self.hiddens.device))

    def join(self, other: _Rows) -> None:
        """Take ``other``'s rows after these, both moved to end at the same position (left padding)."""
        if other.size == 0:
            return
        length = max(self.length, other.length)
        shifts = (length - self.length, length - other.length)
        capacity = max(self.capacity + shifts[0], other.capacity + shifts[1])
        if isinstance(self.past, StaticCache) and not self.past.fits(self.size + other.size, capacity):
            self._unsettle()
        if isinstance(self.past, StaticCache):
            self.past.join(other.past, other.size, other.length - 1, shifts)
        else:
            self.past = joined_cache(self.past, other.past, shifts=shifts, limit=capacity)
        lengths = (self.length, other.length)
        self.ids = shifted_stack(self.ids, other.ids, lengths, shifts, capacity, dim=1)
        self.mask = shifted_stack(self.mask, other.mask, lengths, shifts, capacity, dim=1, after=True)
        if self.hiddens is not None and other.hiddens is not None:
            self.hiddens = shifted_stack(self.hiddens, other.hiddens, lengths, shifts, capacity, dim=1)
        self.begin = torch.cat([self.begin + shifts[0], other.begin + shifts[1]])
        self.end = torch.cat([self.end + shifts[0], other.end + shifts[1]])
        self.items = torch.cat([self.items, other.items])
        self.length, self.capacity = length, capacity
