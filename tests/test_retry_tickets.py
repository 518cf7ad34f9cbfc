"""Retry tickets: a refused realtime job's place is kept for its retry, taken once, and lapses if unused."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from cache import tickets as tickets_module
from cache.tickets import EARLY_S, GRACE_S, RetryTickets

KEYS = ("test:tickets", "test:tickets:work")


@pytest.fixture
def tickets(redis_client: redis.Redis) -> Iterator[RetryTickets]:
    """Return retry tickets on keys of their own, emptied before and after."""
    redis_client.delete(*KEYS)
    yield RetryTickets(redis_client, key=KEYS[0], work_key=KEYS[1])
    redis_client.delete(*KEYS)


def test_a_ticket_is_taken_once_and_only_from_just_before_its_time_until_its_grace_runs_out(
    tickets: RetryTickets,
) -> None:
    now = time.time()
    ticket = tickets.grant(now + 3, [0.0, 1.5])
    assert ticket is not None
    assert not tickets.redeem(ticket, now), "3 s early: not yet"
    assert tickets.redeem(ticket, now + 3 - EARLY_S / 2), "a little early (Retry-After is whole seconds)"
    assert not tickets.redeem(ticket, now + 3), "taken once"
    late = tickets.grant(now + 1, [0.0])
    assert late is not None
    assert not tickets.redeem(late, now + 1 + GRACE_S + 0.1), "lapsed"
    assert not tickets.redeem("0" * 32, now), "unknown"


def test_the_places_kept_are_each_retrys_deadlines_from_its_time_and_lapsed_ones_are_dropped(
    tickets: RetryTickets, redis_client: redis.Redis
) -> None:
    now = time.time()
    tickets.grant(now + 3, [0.0, 1.5])
    tickets.grant(now - 1, [0.5])  # its time has passed but its grace has not: counted from now
    tickets.grant(now - GRACE_S - 1, [0.0])  # lapsed
    tickets.grant(now + 200, [0.0])  # beyond the horizon asked for
    assert sorted(tickets.reserved(now, now + 120)) == pytest.approx([now + 0.5, now + 3, now + 4.5])
    assert redis_client.zcard(KEYS[0]) == 3 and redis_client.hlen(KEYS[1]) == 3, "the lapsed one is gone"


def test_past_the_most_outstanding_tickets_a_refusal_carries_none(
    tickets: RetryTickets, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tickets_module, "MOST", 2)
    now = time.time()
    assert tickets.grant(now + 1, [0.0]) is not None
    assert tickets.grant(now + 1, [0.0]) is not None
    assert tickets.grant(now + 1, [0.0]) is None
