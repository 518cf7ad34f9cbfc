"""One ChatTTS generation pass over a batch (text refinement or speech codes), with our per-item sampler."""

from __future__ import annotations

from typing import Any

import torch

from workers.engines import decode
from workers.engines.decode import Finished
from workers.engines.sampling import PerItemSampler


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
) -> tuple[PerItemSampler, torch.Tensor]:
    """Return ChatTTS's repetition penalty, top-p and top-k fused into one per-item sampler, and the temperatures."""
    rows = 1 if infer_text else chat.config.gpt.num_vq
    sampler = PerItemSampler(
        seeds=seeds,
        rows_per_item=rows,
        eos_token=eos,
        min_tokens=min_tokens,
        max_tokens=max_tokens,
        device=chat.device,
        top_p=params.top_P,
        top_k=params.top_K,
        repetition_penalty=params.repetition_penalty,
    )
    return sampler, torch.tensor([params.temperature] * rows, device=chat.device)


def generate(
    chat: Any,
    prompts: list[str],
    params: Any,
    *,
    seeds: list[int],
    min_tokens: list[int],
    max_tokens: list[int],
    infer_text: bool,
    speakers: list[str | None] | None = None,
    finished: Finished | None = None,
) -> Any:
    """Run one pass of ChatTTS's GPT over ``prompts``; each item is sampled on its own seed and ends at its budget.

    ``finished`` is told each item's output as the item ends (not on ChatTTS's own loop, which ends them together).
    """
    emb, input_ids, attention_mask = _embedded_prompts(chat, prompts, speakers or [])
    eos = chat.tokenizer.eos_token if infer_text else chat.config.gpt.num_audio_tokens - 1
    sampler, temperature = _sampling(
        chat, params, seeds=seeds, min_tokens=min_tokens, max_tokens=max_tokens, infer_text=infer_text, eos=eos
    )
    steps = max(max_tokens) + 1  # one step past the longest budget, in which the sampler ends every item
    if decode.supports(chat.gpt):  # ended items leave the batch
        return decode.generate(
            chat.gpt,
            emb,
            input_ids,
            attention_mask,
            temperature=temperature,
            sampler=sampler,
            eos_token=eos,
            max_new_token=steps,
            infer_text=infer_text,
            return_hidden=not infer_text,
            interrupted=chat.context.get,
            finished=finished,
        )
    generation = chat.gpt.generate(  # every row runs to the end: a model without a key/value cache
        emb,
        input_ids,
        temperature=temperature,
        eos_token=eos,
        attention_mask=attention_mask,
        max_new_token=steps,
        min_new_token=0,
        logits_processors=(sampler,),
        infer_text=infer_text,
        return_hidden=not infer_text,
        stream=False,
        show_tqdm=False,
        ensure_non_empty=False,
        manual_seed=0,
        context=chat.context,
    )
    return next(generation)
