"""The fused per-item sampler draws from exactly the distribution ChatTTS's own logits pipeline gives."""

from __future__ import annotations

import pytest
import torch
from ChatTTS.model import gen_logits

from workers.engines.sampling import PENALTY_WINDOW, PerItemSampler

VOCAB, ROWS, EOS = 626, 8, 625


def _upstream(
    input_ids: torch.Tensor, logits: torch.Tensor, *, top_p: float, top_k: int, penalty: float
) -> torch.Tensor:
    warpers, processors = gen_logits(VOCAB, top_p, top_k, penalty)
    for process in (*processors, *warpers):
        logits = process(input_ids, logits)
    return torch.softmax(logits, dim=1)


def _sampler(**kwargs: float | int) -> PerItemSampler:
    return PerItemSampler(
        seeds=[1, 2],
        rows_per_item=ROWS // 2,
        eos_token=EOS,
        min_tokens=[0, 0],
        max_tokens=[100, 100],
        device=torch.device("cpu"),
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("top_p", "top_k", "penalty"), [(0.7, 20, 1.05), (0.9, 5, 1.0), (0.3, 20, 1.3), (0.7, 20, 1.0)]
)
@pytest.mark.parametrize("sharpness", [1.0, 4.0, 12.0])
def test_candidates_and_probabilities_match_chattts_penalty_top_p_and_top_k(
    top_p: float, top_k: int, penalty: float, sharpness: float
) -> None:
    generator = torch.Generator().manual_seed(int(sharpness * 100 + top_k))
    logits = torch.randn(ROWS, VOCAB, generator=generator) * sharpness
    input_ids = torch.randint(0, VOCAB, (ROWS, 30), generator=generator)
    input_ids[:, -5:] = logits.argmax(dim=1, keepdim=True)  # the penalty must bite on the favourite
    expected = _upstream(input_ids, logits.clone(), top_p=top_p, top_k=top_k, penalty=penalty)
    candidates, probs = _sampler(top_p=top_p, top_k=top_k, repetition_penalty=penalty).distribution(
        input_ids, logits.clone(), steps=input_ids.size(1)
    )
    dense = torch.zeros(ROWS, VOCAB).scatter_(1, candidates, probs)
    assert torch.allclose(dense, expected, atol=1e-6), (dense - expected).abs().max()


def test_the_end_token_is_never_a_candidate_before_an_items_minimum() -> None:
    logits = torch.zeros(ROWS, VOCAB)
    logits[:, EOS] = 50.0  # the model wants to stop
    sampler = PerItemSampler(seeds=[1, 2], rows_per_item=ROWS // 2, eos_token=EOS, min_tokens=[10, 0],
                             max_tokens=[100, 100], device=torch.device("cpu"))  # fmt: skip
    chosen = sampler(torch.zeros(ROWS, 0, dtype=torch.long), logits).argmax(dim=1)
    assert (chosen[: ROWS // 2] != EOS).all(), "item 0 has 10 tokens to go"
    assert (chosen[ROWS // 2 :] == EOS).all()


def test_an_items_tokens_do_not_depend_on_its_batch_mates() -> None:
    generator = torch.Generator().manual_seed(0)
    steps = [torch.randn(ROWS, VOCAB, generator=generator) * 3 for _ in range(40)]

    def run(sampler: PerItemSampler, rows: slice) -> list[torch.Tensor]:
        ids = torch.zeros(rows.stop - rows.start, 0, dtype=torch.long)
        out = []
        for logits in steps:
            token = sampler(ids, logits[rows]).argmax(dim=1, keepdim=True)
            ids = torch.cat([ids, token], dim=1)
            out.append(token)
        return out

    both = PerItemSampler(seeds=[7, 9], rows_per_item=4, eos_token=EOS, min_tokens=[0, 0], max_tokens=[99, 99],
                          device=torch.device("cpu"), repetition_penalty=1.05)  # fmt: skip
    alone = PerItemSampler(seeds=[9], rows_per_item=4, eos_token=EOS, min_tokens=[0], max_tokens=[99],
                           device=torch.device("cpu"), repetition_penalty=1.05)  # fmt: skip
    together = run(both, slice(0, 8))
    by_itself = run(alone, slice(4, 8))
    assert all(torch.equal(t[4:], a) for t, a in zip(together, by_itself, strict=True))


def test_an_item_left_alone_mid_batch_samples_what_it_would_have_with_its_batch_mates() -> None:
    generator = torch.Generator().manual_seed(1)
    steps = [torch.randn(ROWS, VOCAB, generator=generator) * 3 for _ in range(45)]  # crosses a noise block

    def sampler() -> PerItemSampler:
        return PerItemSampler(seeds=[7, 9], rows_per_item=4, eos_token=EOS, min_tokens=[0, 0], max_tokens=[30, 40],
                              device=torch.device("cpu"), repetition_penalty=1.05)  # fmt: skip

    kept, full = sampler(), sampler()
    ids = torch.zeros(ROWS, 0, dtype=torch.long)
    for step, logits in enumerate(steps):
        together = full.sample(ids, logits)
        if step < 10:
            assert torch.equal(kept.sample(ids, logits), together)
        else:
            if step == 10:
                kept.retain(torch.tensor([1]))  # item 0 left the batch
            assert torch.equal(kept.sample(ids[4:], logits[4:]), together[4:]), step
        ids = torch.cat([ids, together.unsqueeze(1)], dim=1)
    assert (together[4:] == EOS).all(), "item 1 still ends at its own maximum"


def test_an_item_that_joins_late_samples_what_it_would_have_alone() -> None:
    generator = torch.Generator().manual_seed(2)
    steps = [torch.randn(ROWS, VOCAB, generator=generator) * 3 for _ in range(60)]
    prompt = torch.randint(0, VOCAB, (ROWS, 16), generator=generator)  # what a window holds before an item's own

    def sampler(seed: int) -> PerItemSampler:
        return PerItemSampler(seeds=[seed], rows_per_item=4, eos_token=EOS, min_tokens=[0], max_tokens=[45],
                              device=torch.device("cpu"), repetition_penalty=1.05)  # fmt: skip

    alone, own = sampler(9), torch.zeros(4, 0, dtype=torch.long)
    expected = []
    for logits in steps[:46]:  # crosses noise blocks, and ends at its maximum
        token = alone.sample(own, logits[4:])
        own = torch.cat([own, token.unsqueeze(1)], dim=1)
        expected.append(token)

    running, history = sampler(7), prompt.clone()  # rows 0-3 run from the start; rows 4-7 join at step 12
    for step, logits in enumerate(steps):
        if step == 12:
            running.extend(sampler(9))
        if step < 12:
            running.sample(history[:4, -PENALTY_WINDOW:], logits[:4])
            history = torch.cat([history, torch.cat([history[:4, -1:], prompt[4:, -1:]])], dim=1)
            continue
        mine = step - 12
        if mine == len(expected):
            break
        rows = torch.cat([logits[:4], steps[mine][4:]])  # the late item sees what it saw alone at its own step
        token = running.sample(history[:, -PENALTY_WINDOW:], rows)
        assert torch.equal(token[4:], expected[mine]), mine
        history = torch.cat([history, token.unsqueeze(1)], dim=1)
    assert (expected[-1] == EOS).all(), "it ends at its own maximum, counted from when it joined"


def test_prompt_tokens_in_the_penalty_window_are_ignored_even_when_their_ids_are_past_the_audio_vocabulary() -> None:
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(ROWS, VOCAB, generator=generator) * 4
    own = torch.randint(0, VOCAB, (ROWS, 3), generator=generator)
    text_prompt = torch.randint(VOCAB, 21178, (ROWS, 13), generator=generator)  # ChatTTS's text token ids
    in_range = torch.randint(0, VOCAB, (ROWS, 13), generator=generator)
    sampler = _sampler(repetition_penalty=1.05)
    with_text = sampler.distribution(torch.cat([text_prompt, own], dim=1), logits.clone(), steps=3)
    with_other = sampler.distribution(torch.cat([in_range, own], dim=1), logits.clone(), steps=3)
    assert torch.equal(with_text[0], with_other[0]) and torch.allclose(with_text[1], with_other[1])
    alone = sampler.distribution(own, logits.clone(), steps=3)
    assert torch.equal(with_text[0], alone[0]) and torch.allclose(with_text[1], alone[1]), "only its own count"


def test_the_penalty_counts_only_each_rows_own_tokens_when_rows_are_at_different_steps() -> None:
    generator = torch.Generator().manual_seed(6)
    logits = torch.randn(ROWS, VOCAB, generator=generator) * 4
    window = torch.randint(0, VOCAB, (ROWS, PENALTY_WINDOW), generator=generator)
    window[:, -4:] = logits.argmax(dim=1, keepdim=True)  # repeats, where the penalty bites hardest
    window[:, 3] = window[:, -1]  # a repeat that some rows count and others do not
    steps = torch.tensor([0, 1, 4, 5, 9, 13, 16, 16])
    sampler = _sampler(repetition_penalty=1.2)
    candidates, probs = sampler.distribution(window, logits.clone(), steps)
    for row, step in enumerate(steps.tolist()):
        own = window[row : row + 1, PENALTY_WINDOW - step :]
        expected = _upstream(own, logits[row : row + 1].clone(), top_p=0.7, top_k=20, penalty=1.2)
        dense = torch.zeros(1, VOCAB).scatter_(1, candidates[row : row + 1], probs[row : row + 1])
        assert torch.allclose(dense, expected, atol=1e-6), (row, (dense - expected).abs().max())
