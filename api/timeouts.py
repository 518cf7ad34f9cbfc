"""Bound a wait on a client's socket as a whole, under gunicorn's gevent worker."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import gevent
from gevent import monkey


@contextlib.contextmanager
def within(seconds: float, what: str) -> Iterator[None]:
    """Raise TimeoutError (naming ``what``) in a read or write still waiting ``seconds`` from now.

    Only a gevent timeout bounds the whole of it: a socket timeout starts again with each byte a client trickles.
    It raises an Exception, not gevent's own Timeout (a BaseException), so that gunicorn and the libraries in
    between treat it as the socket error it is. Outside gevent (Flask's test client, a threaded server) nothing
    could interrupt the wait, and nothing is armed.
    """
    if not monkey.is_module_patched("socket"):
        yield
        return
    with gevent.Timeout(seconds, TimeoutError(f"{what} did not finish within {seconds:g} s")):
        yield
