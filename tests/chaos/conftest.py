"""Fixtures of the fault scenarios: each scenario builds its own stack, torn down whatever happens."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.stack import Stack

IN_CI = os.environ.get("CI") == "true"
MakeStack = Callable[..., Stack]


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker here too, so `--strict-markers` accepts it before pyproject lists it."""
    config.addinivalue_line("markers", "chaos: fault-injection scenarios (make chaos)")
    config.addinivalue_line("markers", "failover: Sentinel failover scenarios (make chaos-failover)")
    config.addinivalue_line("markers", "failover_more: failover scenarios the suite leaves to make chaos-failover")


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator[MakeStack]:
    """Return a factory of fresh stacks (Redis, workers, API app); every one is closed after the test."""
    stacks: list[Stack] = []

    def make(*, worker_env: dict[str, str] | None = None, sentinel: bool = False, **api: Any) -> Stack:
        try:
            stack = Stack(tmp_path / f"stack-{len(stacks)}", worker_env=worker_env, sentinel=sentinel, **api)
        except RuntimeError as e:
            if IN_CI or "redis-server" not in str(e):
                raise
            pytest.skip(str(e))
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.close()
