"""Group waiting segments into engine calls: same model, similar length (a plain function)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def plan_batches(
    items: Sequence[T],
    *,
    length: Callable[[T], int],
    max_batch: int,
    max_ratio: float = 1.5,
    slack: int = 8,
) -> list[list[T]]:
    """Split ``items`` into groups of similar length, at most ``max_batch`` each.

    Engines pad every batch item to the longest, so a group only takes an item
    up to ``max_ratio`` times its shortest length (plus ``slack`` characters, so
    very short texts are not split apart for a handful of characters). Groups
    come back in order of their earliest item, so the oldest work runs first.
    """
    if max_batch < 1:
        raise ValueError("max_batch must be at least 1")
    order = {id(item): position for position, item in enumerate(items)}
    groups: list[list[T]] = []
    current: list[T] = []
    for item in sorted(items, key=length):
        if current and (len(current) >= max_batch or length(item) > max_ratio * length(current[0]) + slack):
            groups.append(current)
            current = []
        current.append(item)
    if current:
        groups.append(current)
    return sorted(groups, key=lambda group: min(order[id(item)] for item in group))
