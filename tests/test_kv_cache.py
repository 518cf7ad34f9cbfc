"""The key/value cache that grows in place holds exactly what transformers' concatenating cache holds."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaModel
from transformers.cache_utils import DynamicCache, DynamicLayer

from workers.engines.kv_cache import FIRST_ROOM, GrowingLayer, growing_cache, joined_cache


def states(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, length, 4, generator=generator), torch.randn(batch, 2, length, 4, generator=generator)


def test_a_growing_layer_holds_what_a_concatenating_layer_holds_across_growths() -> None:
    growing, concatenating = GrowingLayer(limit=400), DynamicLayer()
    rooms = set()
    for step, length in enumerate([7] + [1] * 300):
        keys, values = states(3, length, seed=step)
        got, want = growing.update(keys, values), concatenating.update(keys, values)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
        assert growing.get_seq_length() == concatenating.get_seq_length()
        assert growing.get_mask_sizes(1) == concatenating.get_mask_sizes(1)
        rooms.add(growing._key_buffer.size(-2))  # type: ignore[union-attr]
    assert min(rooms) == 7 + FIRST_ROOM, "the first buffer has room past the prompt"
    assert len(rooms) <= 4, "it grows a few times, not every step"
    assert max(rooms) <= 400, "never past the limit"


def test_a_growing_layer_never_allocates_past_its_limit_but_fits_what_it_is_given() -> None:
    layer = GrowingLayer(limit=10)
    layer.update(*states(1, 8, seed=0))
    assert layer._key_buffer is not None and layer._key_buffer.size(-2) == 10
    layer.update(*states(1, 5, seed=1))  # past the limit: it still holds all of it
    assert layer.get_seq_length() == 13


def test_keeping_some_rows_keeps_exactly_their_keys_and_values() -> None:
    growing, concatenating = GrowingLayer(limit=100), DynamicLayer()
    for step, length in enumerate([5, 1, 1]):
        keys, values = states(4, length, seed=step)
        growing.update(keys, values)
        concatenating.update(keys, values)
    keep = torch.tensor([3, 1])
    growing.batch_select_indices(keep)
    concatenating.batch_select_indices(keep)
    keys, values = states(2, 1, seed=9)
    got, want = growing.update(keys, values), concatenating.update(keys, values)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)


def test_a_llama_decodes_the_same_with_either_cache() -> None:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         vocab_size=50)  # fmt: skip
    model = LlamaModel(config).eval()
    prompt = torch.randn(2, 6, 32)
    outputs = []
    with torch.no_grad():
        for cache in (DynamicCache(config=config), growing_cache(config, limit=6 + 80)):
            hidden, past, steps = None, cache, []
            embeds = prompt
            for _ in range(80):
                out = model(inputs_embeds=embeds, past_key_values=past, use_cache=True)
                past, hidden = out.past_key_values, out.last_hidden_state[:, -1:]
                steps.append(hidden)
                embeds = hidden
            outputs.append(torch.cat(steps, 1))
    assert isinstance(growing_cache(config, 10).layers[0], GrowingLayer)
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)


def filled(rows: int, length: int, seed: int) -> DynamicCache:
    cache = DynamicCache()
    cache.layers = [GrowingLayer(limit=50)]
    cache.layers[0].update(*states(rows, length, seed=seed))
    return cache


def test_joined_caches_hold_each_rows_positions_moved_right_behind_zeros() -> None:
    running, newcomers = filled(2, 9, seed=1), filled(3, 6, seed=2)
    before_a, before_b = running.layers[0].keys.clone(), newcomers.layers[0].keys.clone()
    joined = joined_cache(running, newcomers, shifts=(0, 3), limit=60).layers[0]
    assert joined.keys.shape == (5, 2, 9, 4) and joined.get_seq_length() == 9
    torch.testing.assert_close(joined.keys[:2], before_a, rtol=0, atol=0)
    torch.testing.assert_close(joined.keys[2:, :, 3:], before_b, rtol=0, atol=0)
    assert not joined.keys[2:, :, :3].any(), "the newcomers' padding is zeros (the attention mask hides it)"
    joined.update(*states(5, 1, seed=3))  # it goes on growing in place
    assert joined.get_seq_length() == 10


def test_caches_that_do_not_line_up_are_refused() -> None:
    with pytest.raises(ValueError, match="do not line up"):
        joined_cache(filled(1, 5, seed=1), filled(1, 4, seed=2), shifts=(0, 0), limit=20)
