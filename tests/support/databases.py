"""Databases of the suite's Redis that no running worker serves: quiet statistics, queues and job records."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis


@contextmanager
def spare_database(url: str, db: int) -> Iterator[str]:
    """Yield the URL of database ``db`` on the Redis at ``url``, emptied before and after.

    The database goes in the URL's path: redis-py lets a URL's path win over a ``db`` argument, so
    ``from_url(url, db=9)`` on a URL naming database 0 would empty the suite's own database."""
    spare = f"{url.rsplit('/', 1)[0]}/{db}"
    client = redis.Redis.from_url(spare)
    try:
        client.flushdb()
        yield spare
        client.flushdb()
    finally:
        client.close()
