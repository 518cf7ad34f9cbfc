"""ChatTTS's token-by-token loop, with each item dropped from the batch the step it ends.

ChatTTS's own ``GPT.generate`` runs every row of a batch until the longest item ends: a batch of
one 100-character segment and fifteen 10-character ones pays sixteen rows for the whole length of
the long one. Here an item leaves the batch (its rows of the key/value cache, the inputs, the
sampler's state) at the step it ends, so each step costs what is still being made. Every other
step is ChatTTS's: the same input preparation (its own ``_prepare_generation_inputs``), the same
model call, heads, temperature and end rule; the tokens come from the per-item sampler, whose
noise is per item, so what an item says does not depend on when its batch mates end.

It needs the key/value cache: a model without one (ChatTTS's TransformerEngine Llama, vLLM) goes
through ChatTTS's own loop instead (``supports``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.utils import parametrize

from workers.engines.kv_cache import growing_cache
from workers.engines.sampling import PerItemSampler

#: Told an item's output the step it ends: (its index in the batch, its tokens, its hidden states or None).
Finished = Callable[[int, torch.Tensor, torch.Tensor | None], None]


@dataclass
class Generated:
    """Per item, in input order: its tokens (before its end token) and, if asked, its hidden states."""

    ids: list[torch.Tensor]
    hiddens: list[torch.Tensor]


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
) -> Generated:
    """Generate up to ``max_new_token`` tokens per item; an item ends at the first end token in any of its rows.

    ``emb`` is the prompt's embedding (speaker applied), ``input_ids`` the prompt's ids (batch, length,
    num_vq) and ``attention_mask`` its padding mask, as ChatTTS's tokenizer makes them. ``finished`` is told
    each item's output (its index, tokens and hidden states) at the step the item ends, before the rest go on.
    """
    loop = _Loop(gpt, input_ids, attention_mask, max_new_token, infer_text=infer_text, return_hidden=return_hidden,
                 finished=finished)  # fmt: skip
    # The heads' weight norm is computed once for the whole loop, not once per step.
    with parametrize.cached():
        for step in range(max_new_token):
            hidden = loop.forward(step, emb if step == 0 else None)
            logits = loop.logits(hidden, temperature)
            chosen = sampler.sample(loop.history(step), logits)
            ended = loop.record(step, chosen, eos_token)
            stop = interrupted() or step == max_new_token - 1
            if not stop and not bool(ended.any()):
                continue
            # An item's output stops before its end token; one still going at the last step keeps it all.
            loop.finish(ended.nonzero().squeeze(1), step)
            if stop:
                loop.finish((~ended).nonzero().squeeze(1), step + 1)
                break
            keep = (~ended).nonzero().squeeze(1).cpu()
            if keep.numel() == 0:
                break
            loop.retain(keep)
            sampler.retain(keep)
    return loop.outputs()


class _Loop:
    """The state of one generation: inputs and outputs so far, the key/value cache, the rows still running."""

    def __init__(
        self,
        gpt: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        max_new_token: int,
        *,
        infer_text: bool,
        return_hidden: bool,
        finished: Finished | None = None,
    ) -> None:
        self.gpt = gpt
        self.infer_text = infer_text
        self.return_hidden = return_hidden
        batch, self.prompt, width = input_ids.shape
        total = self.prompt + max_new_token
        self.ids = torch.zeros(batch, total, width, dtype=input_ids.dtype, device=input_ids.device)
        self.ids.narrow(1, 0, self.prompt).copy_(input_ids)
        self.mask = torch.ones(batch, total, dtype=torch.bool, device=input_ids.device)
        self.mask.narrow(1, 0, attention_mask.size(1)).copy_(attention_mask)
        self.hiddens: torch.Tensor | None = None
        self.max_new_token = max_new_token
        self.total = total
        self.alive = torch.arange(batch)  # the original index of each row still running
        self.past: Any = None
        self.ids_out: list[torch.Tensor | None] = [None] * batch
        self.hiddens_out: list[torch.Tensor | None] = [None] * batch
        self.finished = finished

    def forward(self, step: int, emb: torch.Tensor | None) -> torch.Tensor:
        """Run the model on the prompt (step 0, ``emb``) or the last tokens; return each row's last hidden state."""
        gpt, progress = self.gpt, self.prompt + step
        model_input = gpt._prepare_generation_inputs(
            self.ids.narrow(1, 0, progress), self.past, self.mask.narrow(1, 0, progress)
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
        model_input.to(gpt.device_gpt, gpt.gpt.dtype)
        outputs = gpt.gpt(
            attention_mask=model_input.attention_mask,
            position_ids=model_input.position_ids,
            # The first step starts a cache that grows in place, not by copying itself each step (kv_cache).
            past_key_values=self.past if self.past is not None else growing_cache(gpt.gpt.config, self.total),
            inputs_embeds=model_input.inputs_embeds,
            use_cache=True,
            output_attentions=False,
            cache_position=model_input.cache_position,
        )
        self.past = outputs.past_key_values
        hidden: torch.Tensor = outputs.last_hidden_state.narrow(1, -1, 1).squeeze(1).to(gpt.device, dtype=torch.float)
        if self.return_hidden:
            if self.hiddens is None:
                self.hiddens = torch.zeros(hidden.size(0), self.max_new_token, hidden.size(1), device=gpt.device)
            self.hiddens[:, step] = hidden
        return hidden

    def logits(self, hidden: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
        """Return the rows' logits over the vocabulary, an item's num_vq rows together, divided by temperature."""
        gpt = self.gpt
        if self.infer_text:
            logits: torch.Tensor = gpt.head_text(hidden).float()
        else:
            logits = torch.stack([head(hidden) for head in gpt.head_code], 1).float().reshape(-1, gpt.num_audio_tokens)
        rows = temperature.to(logits.device).view(1, -1).expand(hidden.size(0), -1).reshape(-1, 1)
        return logits / rows

    def history(self, step: int) -> torch.Tensor:
        """Return the tokens generated so far, one row per sampled row (what the repetition penalty reads)."""
        generated = self.ids.narrow(1, self.prompt, step)
        history = (
            generated[:, :, 0]
            if self.infer_text
            else generated.permute(0, 2, 1).reshape(-1 if step else generated.size(0) * generated.size(2), step)
        )
        return history.to(self.gpt.device)

    def record(self, step: int, chosen: torch.Tensor, eos_token: int) -> torch.Tensor:
        """Store this step's tokens; return which rows ended (an end token in any of an item's rows)."""
        chosen = chosen.to(self.ids.device)
        if self.infer_text:
            self.ids[:, self.prompt + step] = chosen.unsqueeze(1).expand(-1, self.ids.size(2))
            return chosen.eq(eos_token)
        chosen = chosen.view(-1, self.gpt.num_vq)
        self.ids[:, self.prompt + step] = chosen
        return chosen.eq(eos_token).any(1)

    def finish(self, positions: torch.Tensor, length: int) -> None:
        """Keep the first ``length`` tokens (and hidden states) of the rows at ``positions`` as their items' output."""
        for position in positions.tolist():
            item = int(self.alive[position])
            tokens = self.ids[position].narrow(0, self.prompt, length)
            self.ids_out[item] = tokens[:, 0].clone() if self.infer_text else tokens.clone()
            if self.hiddens is not None:
                self.hiddens_out[item] = self.hiddens[position].narrow(0, 0, length).clone()
            if self.finished is not None:
                self.finished(item, self.ids_out[item], self.hiddens_out[item])  # type: ignore[arg-type]

    def retain(self, keep: torch.Tensor) -> None:
        """Keep only the rows at positions ``keep``: their inputs, outputs and key/value cache."""
        self.alive = self.alive.index_select(0, keep.to(self.alive.device))
        self.past.batch_select_indices(keep.to(self.gpt.device_gpt))
        self.ids = self.ids.index_select(0, keep.to(self.ids.device))
        self.mask = self.mask.index_select(0, keep.to(self.mask.device))
        if self.hiddens is not None:
            self.hiddens = self.hiddens.index_select(0, keep.to(self.hiddens.device))

    def outputs(self) -> Generated:
        """Return every item's output, in input order."""
        width = () if self.infer_text else (self.ids.size(2),)
        no_ids = torch.zeros(0, *width, dtype=self.ids.dtype)
        no_hidden = torch.zeros(0, self.gpt.gpt.config.hidden_size, device=self.gpt.device)
        return Generated(
            ids=[t if t is not None else no_ids for t in self.ids_out],
            hiddens=[h if h is not None else no_hidden for h in self.hiddens_out] if self.return_hidden else [],
        )
