"""Look at processes through /proc (Linux), and wait for a condition with a deadline (devstack's)."""

from __future__ import annotations

from devstack.processes import alive, children, cmdline, descendants, environ, kill_quietly, wait_for

__all__ = ["alive", "children", "cmdline", "descendants", "environ", "kill_quietly", "wait_for"]
