"""A key/value cache that grows in place, so a decode step costs what it computes, not the whole cache again.

transformers' ``DynamicLayer`` appends each step's keys and values with ``torch.cat``, which copies the
whole cache: at ChatTTS's real size (20 layers, 12 heads of 64) and a batch of 16 at 150 positions that
is about 300 MB of copying per step, and the copying grows with the square of the length. Here each
layer holds a buffer with room to spare (it doubles when full, up to the length the generation can
reach), writes a step's keys and values into it, and hands attention a view of the filled part. The
saving grows with the segments' length; on short segments the two are alike.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

#: Positions a buffer has room for past the prompt before its first growth.
FIRST_ROOM = 64


class GrowingLayer(DynamicLayer):  # type: ignore[misc,no-untyped-call]
    """One layer's keys and values in a buffer with spare room; ``keys``/``values`` are views of the filled part."""

    def __init__(self, limit: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.limit = limit  # the most positions this generation can reach: the buffer never grows past it
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Write the new positions after the filled ones; return views of every filled position."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new_length = self._length + key_states.size(-2)
        if self._key_buffer is None or new_length > self._key_buffer.size(-2):
            self._grow(key_states, value_states, new_length)
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer.narrow(-2, self._length, key_states.size(-2)).copy_(key_states)
        self._value_buffer.narrow(-2, self._length, value_states.size(-2)).copy_(value_states)
        self._length = new_length
        self._show_filled()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows at ``indices`` (the items still being generated)."""
        if self._key_buffer is None or self._value_buffer is None:
            return
        self._key_buffer = self._key_buffer.index_select(0, indices.to(self._key_buffer.device))
        self._value_buffer = self._value_buffer.index_select(0, indices.to(self._value_buffer.device))
        self._show_filled()

    def drop_front(self, count: int) -> None:
        """Forget the first ``count`` positions of every row (padding no row attends to any more); no copy."""
        if count <= 0 or self._key_buffer is None or self._value_buffer is None:
            return
        room = self._key_buffer.size(-2) - count
        self._key_buffer = self._key_buffer.narrow(-2, count, room)
        self._value_buffer = self._value_buffer.narrow(-2, count, room)
        self._length -= count
        self.limit -= count
        self._show_filled()

    def joined(self, other: GrowingLayer, shifts: tuple[int, int], limit: int) -> GrowingLayer:
        """Return a layer of this one's rows then ``other``'s, each moved ``shifts`` positions later (zeros before)."""
        length = self._length + shifts[0]
        if other._length + shifts[1] != length:
            raise ValueError(f"caches of {self._length}+{shifts[0]} and {other._length}+{shifts[1]} positions "
                             "do not line up")  # fmt: skip
        if (
            self._key_buffer is None
            or self._value_buffer is None
            or other._key_buffer is None
            or (other._value_buffer is None)
        ):
            raise ValueError("only caches that hold positions can be joined")
        layer = GrowingLayer(max(limit, length))
        room = min(layer.limit, length + FIRST_ROOM)
        lengths = (self._length, other._length)
        layer._key_buffer = shifted_stack(self._key_buffer, other._key_buffer, lengths, shifts, room, dim=2)
        layer._value_buffer = shifted_stack(self._value_buffer, other._value_buffer, lengths, shifts, room, dim=2)
        layer.lazy_initialization(layer._key_buffer, layer._value_buffer)
        layer._length = length
        layer._show_filled()
        return layer

    def _show_filled(self) -> None:
        """Point ``keys`` and ``values`` (what attention reads) at the filled positions of the buffers."""
        assert self._key_buffer is not None and self._value_buffer is not None
        self.keys = self._key_buffer.narrow(-2, 0, self._length)
        self.values = self._value_buffer.narrow(-2, 0, self._length)

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        room = needed + FIRST_ROOM if self._key_buffer is None else 2 * needed
        room = max(needed, min(room, self.limit))
        self._key_buffer = self._moved(self._key_buffer, key_states, room)
        self._value_buffer = self._moved(self._value_buffer, value_states, room)

    def _moved(self, old: torch.Tensor | None, like: torch.Tensor, room: int) -> torch.Tensor:
        shape = (like.size(0), like.size(1), room, like.size(3))
        buffer = torch.empty(shape, dtype=like.dtype, device=like.device)
        if old is not None:
            buffer.narrow(-2, 0, self._length).copy_(old.narrow(-2, 0, self._length))
        return buffer


def growing_cache(config: Any, limit: int) -> DynamicCache:
    """Return an empty cache for a model of ``config`` whose layers grow in place up to ``limit`` positions."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer(limit) for _ in range(len(cache.layers))]
    return cache


def joined_cache(first: DynamicCache, second: DynamicCache, *, shifts: tuple[int, int], limit: int) -> DynamicCache:
    """Make ``first`` hold its rows then ``second``'s, each moved ``shifts`` positions later; return it.

    The positions a shift leaves empty at the start hold zeros, which the attention mask must hide: this is how
    items whose generation started at other lengths join one running batch (left padding). Both caches must hold
    the same number of positions once shifted; the result grows in place up to ``limit`` positions.
    """
    layers: list[Any] = [
        _growing(a).joined(_growing(b), shifts, limit) for a, b in zip(first.layers, second.layers, strict=True)
    ]
    first.layers = layers
    return first


def _growing(layer: object) -> GrowingLayer:
    if not isinstance(layer, GrowingLayer):
        raise TypeError(f"only caches made by growing_cache can be joined, not one of {type(layer).__name__}")
    return layer


def shifted_stack(
    a: torch.Tensor,
    b: torch.Tensor,
    lengths: tuple[int, int],
    shifts: tuple[int, int],
    size: int,
    *,
    dim: int,
    after: float | bool = 0,
) -> torch.Tensor:
    """Stack ``a``'s rows on ``b``'s (dimension 0), each one's first ``lengths`` positions (dimension ``dim``)
    moved ``shifts`` later in ``size`` positions: zeros (``False``) before them, ``after`` past them."""
    shape = list(a.shape)
    shape[0], shape[dim] = a.size(0) + b.size(0), size
    stacked = torch.full(shape, after, dtype=a.dtype, device=a.device)
    for rows, source, length, shift in ((stacked[: a.size(0)], a, lengths[0], shifts[0]),
                                        (stacked[a.size(0) :], b, lengths[1], shifts[1])):  # fmt: skip
        rows.narrow(dim, 0, shift).zero_()
        rows.narrow(dim, shift, length).copy_(source.narrow(dim, 0, length).to(a.device, a.dtype))
    return stacked


def drop_front(cache: DynamicCache, count: int) -> None:
    """Forget the first ``count`` positions of every row of every layer of a ``growing_cache``."""
    for layer in cache.layers:
        _growing(layer).drop_front(count)
