"""A job's audio a fragment at a time, as the model makes it, from its event stream (``TTSClient.fragments``)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from client.errors import TTSClientError

#: The events after which a job's event stream ends.
ENDING_EVENTS = frozenset({"done", "failed", "canceled", "expired"})


class Fragment(NamedTuple):
    """Fragment ``number`` of segment ``segment`` (its index): raw 16-bit little-endian mono PCM at
    ``sample_rate``; ``last`` on its segment's last one."""

    segment: int
    number: int
    pcm: bytes
    sample_rate: int
    last: bool


def fragment_of(data: Any) -> Fragment:
    """Read a ``fragment`` event's data; raise ``bad_answer`` for one that is not the service's."""
    try:
        return Fragment(
            int(data["index"]),
            int(data["fragment"]),
            base64.b64decode(data["pcm16"], validate=True),
            int(data["sample_rate"]),
            bool(data["last"]),
        )
    except (KeyError, TypeError, ValueError, binascii.Error) as e:
        raise TTSClientError(0, "bad_answer", f"a fragment event the client cannot read: {e!r}") from e


def fragments_of(events: Iterable[dict[str, Any]], *, after: str | None = None) -> Iterator[Fragment]:
    """Yield the fragments of a job's event stream (asked for with ``?fragments=1``) until the job is done; raise
    ``job_failed`` if it fails or is canceled.

    Each segment ends with a fragment whose ``last`` is true: when the service could not tell that a fragment was
    its segment's last as it sent it, the segment's own event ends it with an empty one. ``after`` is the id the
    stream resumes after, if any.
    """
    previous = _resumed_after(after)
    for event in events:
        name = event["event"]
        if name == "fragment":
            previous = fragment_of(event["data"])
            yield previous
        elif name == "segment":
            index = int(event["data"]["index"])
            if previous is not None and previous.segment == index and not previous.last:
                yield Fragment(index, previous.number + 1, b"", previous.sample_rate, last=True)
            previous = None
        elif name in ENDING_EVENTS:
            if name != "done":
                raise TTSClientError(409, "job_failed", f"job {name}: {event['data']}")
            return


def _resumed_after(after: str | None) -> Fragment | None:
    """Return what is known of the fragment a stream resumes after (its audio was had before): where it is."""
    index, dot, number = (after or "").partition(".")
    if not (dot and index.isdigit() and number.isdigit()):
        return None  # none, or a segment's: its fragments all came
    return Fragment(int(index), int(number), b"", 0, last=False)
