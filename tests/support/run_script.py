"""`make run` (scripts/run.sh under supervisord) as a test drives it, and the tools it needs or a skip."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from devstack.run_script import RunScript, readyz

__all__ = ["RunScript", "readyz", "supervisorctl_or_skip"]


def supervisorctl_or_skip() -> Path:
    """Return the venv's supervisorctl; skip locally (fail in CI) when it or redis-server is missing."""
    supervisorctl = Path(sys.executable).with_name("supervisorctl")
    tools = {"redis-server": shutil.which("redis-server") is not None, "supervisor": supervisorctl.exists()}
    missing = [name for name, present in tools.items() if not present]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"missing: {missing}")
        pytest.skip(f"missing: {missing} (make install; scripts/ensure_redis_server.sh)")
    return supervisorctl
