"""Answer only with what a replica holds: under a Sentinel group, every answer waits for a confirmation.

After a failover the API may still hold connections to the old primary, which answers from stale data (and takes
writes its demotion will erase) until the Sentinels make it a replica. So each request opens a log of the nodes its
replies came from (cache/nodes.py), and before its answer goes out, a confirmation that began after those replies
must succeed on that node (cache/replication.py): else the answer is 503 with Retry-After, and the next request
reaches the primary the Sentinels name. A stream confirms each chunk it sends the same way, in a log of its own
(api/holds.py: a streamed body runs after the request's teardown). Health probes and the metrics are not confirmed:
they must answer while the store fails over. With one Redis, or no replicas to wait for, nothing is logged and
nothing waits.
"""

from __future__ import annotations

from flask import Flask, Response, request

from api.access import OPEN_ENDPOINTS
from api.errors import unreplicated
from cache.nodes import close_log, open_log
from cache.replication import Replication, Unreplicated


def init_app(app: Flask, replication: Replication) -> None:
    """Confirm every answer of ``app`` while ``replication`` has replicas to wait for."""
    if not replication.replicas:
        return

    def _log_nodes() -> None:
        open_log()

    # Before every other hook, so that what the access checks read is confirmed too; and its after-request hook,
    # registered last, runs first, so that the metrics count the answer that goes out.
    app.before_request_funcs.setdefault(None, []).insert(0, _log_nodes)

    @app.after_request
    def _confirm(response: Response) -> Response:
        # Nothing read is served in a 5xx; probes and the metrics must answer while the store fails over.
        if response.status_code >= 500 or request.endpoint in OPEN_ENDPOINTS:
            return response
        try:
            replication.confirm_noted()
        except Unreplicated as e:
            response.close()  # a stream's hold is given back (api/holds.py): its body will never run
            return unreplicated(e)
        return response

    @app.teardown_request
    def _close(_: BaseException | None) -> None:
        close_log()
