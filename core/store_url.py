"""Where the job store is: one Redis (``redis://``, ``rediss://``, ``unix://``) or a Sentinel group.

A Sentinel group is named in one URL, so that it goes everywhere a Redis URL goes (REDIS_URL, TTS_CACHE_REDIS_URL):

    redis+sentinel://[[user]:password@]host:port[,host:port...]/<service>[/<db>][?sentinel_password=...]

The userinfo authenticates to the data nodes (the primary the Sentinels name); ``sentinel_password``, when the
Sentinels themselves require one. Pure parsing: building clients from it is ``cache.connect``'s part.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379
FORM = f"{SCHEME}://[[user]:password@]host:port[,host:port...]/<service>[/<db>]"


@dataclass(frozen=True)
class SentinelUrl:
    """A Sentinel group as a URL names it."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


def is_sentinel(url: str | None) -> bool:
    """Return whether ``url`` names a Sentinel group rather than one Redis."""
    return bool(url) and str(url).lower().startswith(SCHEME + "://")


def _address(part: str) -> tuple[str, int]:
    host, sep, port = part.rpartition(":") if not part.endswith("]") else (part, "", "")
    if not sep:
        host, port = part, str(DEFAULT_SENTINEL_PORT)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{part!r} is no Sentinel address (host:port); the form is {FORM}")
    return host, int(port)


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Parse a ``redis+sentinel://`` URL; a malformed one raises ValueError saying what is wrong."""
    if not is_sentinel(url):
        raise ValueError(f"not a Sentinel URL; the form is {FORM}")
    rest = url.split("://", 1)[1]
    netloc, _, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        userinfo, hosts = "", netloc
    username: str | None = None
    password: str | None = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = tuple(_address(part.strip()) for part in hosts.split(",") if part.strip())
    if not sentinels:
        raise ValueError(f"a Sentinel URL names at least one Sentinel; the form is {FORM}")
    path = urlsplit("x://h/" + tail)
    service, _, db = path.path.lstrip("/").partition("/")
    service = unquote(service)
    if not service:
        raise ValueError(f"a Sentinel URL names the service its Sentinels monitor (`/mymaster`); the form is {FORM}")
    db = db.strip("/") or "0"
    if not db.isdigit():
        raise ValueError(f"the database number {db!r} is no number; the form is {FORM}")
    query = parse_qs(path.query)
    unknown = sorted(set(query) - {"sentinel_password"})
    if unknown:
        raise ValueError(f"a Sentinel URL takes only sentinel_password as a query parameter, not {', '.join(unknown)}")
    sentinel_password = query.get("sentinel_password", [None])[-1]
    return SentinelUrl(sentinels, service, int(db), username, password, sentinel_password)


def check_store_url(url: str) -> str:
    """Return ``url`` if it names a store the service can reach; raise ValueError saying the accepted forms if not."""
    if is_sentinel(url):
        parse_sentinel_url(url)
        return url
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"use redis://, rediss://, unix:// or {FORM}, not {url.split('://', 1)[0]!r}")
    return url
