"""Saving a whole audio answer to a file, appended to a partial one when the service resumed it by Range."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import requests

from client.errors import TTSClientError


def save_answer(
    response: requests.Response,
    partial: Path,
    *,
    offset: int,
    on_progress: Callable[[int, int | None], None] | None,
    what: str,
) -> None:
    """Write ``response``'s body into ``partial``: after its first ``offset`` bytes when the answer is the 206 that
    resumes there, else from the start; report (bytes so far, whole size or None) to ``on_progress``."""
    appending = response.status_code == 206 and response.headers.get("Content-Range", "").startswith(f"bytes {offset}-")
    done = offset if appending else 0
    length = response.headers.get("Content-Length")
    total = done + int(length) if length is not None and "Content-Encoding" not in response.headers else None
    try:
        with partial.open("ab" if appending else "wb") as out:
            for chunk in response.iter_content(chunk_size=64 * 1024):
                out.write(chunk)
                done += len(chunk)
                if on_progress is not None:
                    on_progress(done, total)
    except requests.RequestException as e:
        raise TTSClientError(0, "unreachable", f"{what} broke off: {e}") from e
