"""Answer only with what a replica holds: under a Sentinel group, every answer waits for a confirmation.

After a failover the API may still hold connections to the old primary, which answers from stale data (and takes
writes its demotion will erase) until the Sentinels make it a replica. So each request opens a log of the nodes its
replies came from (cache/nodes.py), and before its answer goes out, a confirmation that began after those replies
must succeed on that node (cache/replication.py): else the answer is 503 with Retry-After, and the next request
reaches the primary the Sentinels name. A stream confirms each chunk it sends the same way (api/holds.py). With
one Redis, or no replicas to wait for, nothing is logged and nothing waits.
"""

from __future__ import annotations

from flask import Flask, Response

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
        if response.status_code >= 500:  # nothing it read is served
            return response
        try:
            replication.confirm_noted()
        except Unreplicated as e:
            return unreplicated(e)
        return response

    @app.teardown_request
    def _close(_: BaseException | None) -> None:
        close_log()
