"""A key/value cache allocated once per model host, whose buffers never move: what a CUDA graph can replay over.

A graph replays kernels on the addresses it saw when it was captured, so every tensor a decode step reads or
writes must live at one address for the host's life. Here each layer's keys and values are buffers of
``rows`` × heads × ``positions`` × head size, made once. A call's items occupy the first rows (an item that
ends gives its row up: the rows after it move down; one that joins takes the next free row), and every row
writes the same column each step (rows of other lengths are padded on the left, as ``decode`` pads them).
Rows and columns move only between steps, by copies within the buffers, never by reallocation.

A step reads ``width`` columns of the first ``active`` rows: on CUDA a bucket's rows and width (a graph has
fixed shapes, and the mask hides what is not yet written); eagerly only the rows in use and the filled
columns, which is cheaper where nothing is replayed. Prompts (of any length) run on a growing cache first and
are copied in.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from workers.engines.kv_cache import growing_cache


@dataclass
class Reach:
    """What the next step reads and writes, shared by every layer: a bucket's rows, columns, the column written."""

    active: int
    width: int
    column: torch.Tensor  # one long, on the device: the column this step writes (a tensor, so graphs replay it)


class StaticLayer(DynamicLayer):  # type: ignore[misc,no-untyped-call]
    """One layer's keys and values in buffers that never move."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, reach: Reach) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.key_buffer, self.value_buffer, self.reach = keys, values, reach
        self.lazy_initialization(keys, values)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Write one step's keys and values at the shared column; return what attention reads."""
        if key_states.size(-2) != 1:
            raise ValueError("a static cache takes one position a step; prompts run on a growing cache")
        reach = self.reach
        keys, values = self.key_buffer.narrow(0, 0, reach.active), self.value_buffer.narrow(0, 0, reach.active)
        keys.index_copy_(2, reach.column, key_states)
        values.index_copy_(2, reach.column, value_states)
        self.keys, self.values = keys.narrow(2, 0, reach.width), values.narrow(2, 0, reach.width)
        return self.keys, self.values

    def get_seq_length(self, *args: Any, **kwargs: Any) -> int:
        return self.reach.width


class StaticCache(DynamicCache):
    """Every layer's buffers, ``rows`` × ``positions``, and the bookkeeping of which rows and columns are in use."""

    def __init__(self, config: Any, *, rows: int, positions: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(config=config)
        heads, head_size = _heads(config)
        self.rows, self.positions = rows, positions
        self.reach = Reach(active=0, width=0, column=torch.zeros(1, dtype=torch.long, device=device))
        shape = (rows, heads, positions, head_size)
        # Zeros, not empty: a padding row attends over whatever its row holds, and must never meet a NaN.
        self.static_layers = [self._layer(shape, dtype, device) for _ in range(len(self.layers))]
        self.layers = list(self.static_layers)
        self.used = 0  # rows holding items
        self.length = 0  # columns filled (the same in every row in use)

    def _layer(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> StaticLayer:
        zeros = torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
        return StaticLayer(*zeros, self.reach)

    @staticmethod
    def bytes_for(config: Any, *, rows: int, positions: int, dtype: torch.dtype) -> int:
        """Return what the buffers of a model of ``config`` take at this size."""
        heads, head_size = _heads(config)
        return int(2 * config.num_hidden_layers * rows * heads * positions * head_size * dtype.itemsize)

    def fits(self, rows: int, positions: int) -> bool:
        """Say whether ``rows`` items of ``positions`` columns fit."""
        return rows <= self.rows and positions <= self.positions

    def aim(self) -> None:
        """Point the next step at the next free column."""
        if self.length >= self.positions:
            raise ValueError(f"a static cache of {self.positions} columns is full")
        self.reach.column.fill_(self.length)

    def advance(self) -> None:
        """Count the column the step wrote as filled."""
        self.length += 1

    def take(self, growing: DynamicCache, rows: int, length: int) -> StaticCache:
        """Hold ``growing``'s ``rows`` rows of ``length`` columns (its only ones) in the first rows; return self.

        The columns past them are zeroed: a step over a graph's width multiplies them by a weight of zero, which
        hides anything finite, but a NaN or infinity left by an earlier call would come through.
        """
        for buffer, part in self._beside(growing):
            held = buffer.narrow(0, 0, rows)
            held.narrow(2, 0, length).copy_(part.narrow(2, 0, length))
            held.narrow(2, length, self.positions - length).zero_()
        self.used, self.length = rows, length
        return self

    def join(self, growing: DynamicCache, rows: int, length: int, shifts: tuple[int, int]) -> None:
        """Take ``growing``'s rows after these, both moved ``shifts`` columns later (left padding), in place."""
        own = self.length
        for buffer, part in self._beside(growing):
            if shifts[0]:
                mine = buffer.narrow(0, 0, self.used)
                mine.narrow(2, shifts[0], own).copy_(mine.narrow(2, 0, own).clone())
                mine.narrow(2, 0, shifts[0]).zero_()
            theirs = buffer.narrow(0, self.used, rows)  # rows that padding or ended items wrote: zeroed first
            theirs.narrow(2, 0, shifts[1]).zero_()
            theirs.narrow(2, shifts[1], length).copy_(part.narrow(2, 0, length))
            theirs.narrow(2, shifts[1] + length, self.positions - shifts[1] - length).zero_()
        self.used += rows
        self.length = own + shifts[0]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows at ``indices`` (ascending), moved down to the first rows."""
        count = int(indices.numel())
        if count:
            indices = indices.to(self.reach.column.device)
            for buffer in self._buffers():
                filled = buffer.narrow(2, 0, self.length)  # only the filled columns are worth moving
                filled.narrow(0, 0, count).copy_(filled.index_select(0, indices))
        self.used = count

    def drop_front(self, count: int) -> None:
        """Forget the first ``count`` columns of every row in use (padding no row attends to any more)."""
        if count <= 0:
            return
        kept = self.length - count
        for buffer in self._buffers():
            mine = buffer.narrow(0, 0, self.used)
            mine.narrow(2, 0, kept).copy_(mine.narrow(2, count, kept).clone())
            mine.narrow(2, kept, count).zero_()  # past the filled columns a row holds zeros (see take)
        self.length = kept

    def _buffers(self) -> Iterator[torch.Tensor]:
        """Yield every layer's key buffer, then its value buffer."""
        for layer in self.static_layers:
            yield layer.key_buffer
            yield layer.value_buffer

    def _beside(self, growing: DynamicCache) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield each of this cache's buffers beside the same layer's keys or values in ``growing``."""
        for layer, source in zip(self.static_layers, _layers(growing), strict=True):
            yield layer.key_buffer, source.keys
            yield layer.value_buffer, source.values

    def grown_copy(self, config: Any, limit: int) -> DynamicCache:
        """Return the rows in use as a growing cache of up to ``limit`` columns (for a call that outgrows this)."""
        cache = growing_cache(config, limit)
        for layer, mine in zip(_layers(cache), self.static_layers, strict=True):
            layer.update(mine.key_buffer.narrow(0, 0, self.used).narrow(2, 0, self.length).clone(),
                         mine.value_buffer.narrow(0, 0, self.used).narrow(2, 0, self.length).clone())  # fmt: skip
        return cache


def _heads(config: Any) -> tuple[int, int]:
    """Return a model config's key/value heads and head size."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return heads, getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _layers(cache: DynamicCache) -> list[Any]:
    """Return a cache's layers, typed loosely: transformers types them as a union without keys and values."""
    return list(cache.layers)
