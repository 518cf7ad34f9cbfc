"""One ChatTTS generation pass over a batch (text refinement or speech codes), with our per-item sampler."""

from __future__ import annotations

from typing import Any

import torch

from workers.engines import decode
from workers.engines.decode import Finished, Grown, Joins
from workers.engines.sampling import PerItemSampler
from workers.engines.static_step import StaticStep


def _embedded_prompts(chat: Any, prompts: list[str], speakers: list[str | None]) -> tuple[Any, Any, Any]:
    """Return the prompts' embeddings (each item's speaker applied), their token ids and attention mask."""
    input_ids, attention_mask, text_mask = chat.tokenizer.encode(
        prompts, chat.config.gpt.num_vq, device=chat.device_gpt
    )
    emb = chat.embed(input_ids, text_mask)
    for i, embedding in enumerate(speakers):
        if embedding is not None:
            chat.speaker.apply(
                emb.narrow(0, i, 1),
                embedding,
                input_ids.narrow(0, i, 1),
                chat.tokenizer.spk_emb_ids,
                chat.gpt.device_gpt,
            )
    return emb, input_ids, attention_mask


def _sampling(
    chat: Any,
    params: Any,
    *,
    seeds: list[int],
    min_tokens: list[int],
    max_tokens: list[int],
    infer_text: bool,
    eos: int,
) -> PerItemSampler:
    """Return ChatTTS's repetition penalty, top-p and top-k fused into one per-item sampler."""
    return PerItemSampler(
        seeds=seeds,
        rows_per_item=1 if infer_text else chat.config.gpt.num_vq,
        eos_token=eos,
        min_tokens=min_tokens,
        max_tokens=max_tokens,
        device=chat.device,
        top_p=params.top_P,
        top_k=params.top_K,
        repetition_penalty=params.repetition_penalty,
    )


def prepare(
    chat: Any,
    prompts: list[str],
    params: Any,
    *,
    seeds: list[int],
    min_tokens: list[int],
    max_tokens: list[int],
    infer_text: bool,
    speakers: list[str | None] | None = None,
) -> decode.Joining:
    """Return ``prompts`` ready to generate: embedded (each item's speaker applied), with their own sampler."""
    emb, input_ids, attention_mask = _embedded_prompts(chat, prompts, speakers or [])
    sampler = _sampling(chat, params, seeds=seeds, min_tokens=min_tokens, max_tokens=max_tokens,
                        infer_text=infer_text, eos=_eos(chat, infer_text))  # fmt: skip
    # One step past the longest budget, in which the sampler ends every item.
    return decode.Joining(emb, input_ids, attention_mask, sampler, max_new_token=max(max_tokens) + 1)


def _eos(chat: Any, infer_text: bool) -> int:
    return int(chat.tokenizer.eos_token if infer_text else chat.config.gpt.num_audio_tokens - 1)


def generate(
    chat: Any,
    first: decode.Joining,
    params: Any,
    *,
    infer_text: bool,
    finished: Finished | None = None,
    joins: Joins | None = None,
    grown: Grown | None = None,
    static: StaticStep | None = None,
) -> Any:
    """Run one pass of ChatTTS's GPT over ``first`` (made by ``prepare``); each item ends at its budget.

    ``finished`` is told each item's output as the item ends (not on ChatTTS's own loop, which ends them together).
    ``joins`` (made with ``prepare``) is asked between steps for items to add; ChatTTS's own loop never asks.
    ``grown`` is told each running item's hidden states after each step (ChatTTS's own loop never tells it).
    ``static`` runs the steps after the prompt's over a static key/value cache, CUDA-graphed where it was captured.
    """
    eos = _eos(chat, infer_text)
    temperature = torch.tensor([params.temperature] * (1 if infer_text else chat.config.gpt.num_vq), device=chat.device)
    if decode.supports(chat.gpt):  # ended items leave the batch
        return decode.generate(
            chat.gpt,
            first.emb,
            first.input_ids,
            first.attention_mask,
            temperature=temperature,
            sampler=first.sampler,
            eos_token=eos,
            max_new_token=first.max_new_token,
            infer_text=infer_text,
            return_hidden=not infer_text,
            interrupted=chat.context.get,
            finished=finished,
            joins=joins,
            grown=grown,
            static=static,
        )
    generation = chat.gpt.generate(  # every row runs to the end: a model without a key/value cache
        first.emb,
        first.input_ids,
        temperature=temperature,
        eos_token=eos,
        attention_mask=first.attention_mask,
        max_new_token=first.max_new_token,
        min_new_token=0,
        logits_processors=(first.sampler,),
        infer_text=infer_text,
        return_hidden=not infer_text,
        stream=False,
        show_tqdm=False,
        ensure_non_empty=False,
        manual_seed=0,
        context=chat.context,
    )
    return next(generation)
