"""Bound the whole time a server may take over an answer's headers or a JSON body, however slowly it sends them.

requests' read timeout bounds each wait for bytes, not the whole: a server (or a proxy in front of one) that
trickles a byte every few seconds holds its caller for as long as it likes. Here a watchdog shuts the
connection's socket once the limit has passed, so the read under way ends at once: headers must all arrive
within the request's read timeout (the long-poll's wait included), and a JSON answer's body within the client's
timeout. The request then fails as a read timeout, as a silent server's does.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool


class Watchdog:
    """Call ``shut`` if the block it guards has not ended ``seconds`` after it began; say whether it did."""

    def __init__(self, seconds: float, shut: Callable[[], None]) -> None:
        self.seconds = seconds
        self._shut = shut
        self._lock = threading.Lock()
        self._over = False
        self.fired = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        with self._lock:
            if self._over:
                return
            self.fired = True
        with contextlib.suppress(OSError, ValueError, RuntimeError):  # closed, or given back to its pool, meanwhile
            self._shut()

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        with self._lock:  # from here on the watchdog shuts nothing: a fire racing this exit sees ``_over``
            self._over = True
        self._timer.cancel()


class _HeadersDue:
    """A urllib3 connection whose answer's headers must all arrive within its read timeout."""

    sock: socket.socket | None
    timeout: Any

    def getresponse(self) -> Any:
        sock, limit = self.sock, self.timeout
        if sock is None or not isinstance(limit, int | float) or limit <= 0:
            return super().getresponse()  # type: ignore[misc]
        with Watchdog(limit, lambda: sock.shutdown(socket.SHUT_RDWR)) as watchdog:
            try:
                response = super().getresponse()  # type: ignore[misc]
            except Exception as e:
                if watchdog.fired:  # urllib3 reports a socket timeout as a read timeout
                    raise TimeoutError(f"the answer's headers took over {limit:g} s") from e
                raise
        if watchdog.fired:  # it fired as the last header came: the socket is shut, so the body could not be read
            response.close()
            raise TimeoutError(f"the answer's headers took over {limit:g} s")
        return response


class _Connection(_HeadersDue, HTTPConnection):
    pass


class _TLSConnection(_HeadersDue, HTTPSConnection):
    pass


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection


class _TLSPool(HTTPSConnectionPool):
    ConnectionCls = _TLSConnection


class HeadersDueAdapter(HTTPAdapter):
    """requests' adapter whose connections bound the whole wait for an answer's headers (mount it on a session)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _Pool, "https": _TLSPool}

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        """Return requests' manager for ``proxy`` (HTTP(S)_PROXY), its connections bounded the same way."""
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if hasattr(manager, "pool_classes_by_scheme"):  # a SOCKS proxy's manager makes connections of its own
            manager.pool_classes_by_scheme = {"http": _Pool, "https": _TLSPool}
        return manager


def shutter(raw: Any) -> Callable[[], None]:
    """Return what shuts the socket a urllib3 answer ``raw`` is read from (nothing for none, or an old urllib3)."""
    shutdown: Callable[[], None] | None = getattr(raw, "shutdown", None)  # urllib3 2.3 and later
    if callable(shutdown):
        return shutdown
    sock = getattr(getattr(raw, "_connection", None), "sock", None)
    if sock is None:
        return lambda: None
    return lambda: sock.shutdown(socket.SHUT_RDWR)
