"""GET one URL of the local API and print its body: scripts/run.sh's stand-in for curl.

    python scripts/api_get.py URL      print the body; exit 1, saying why on stderr, on an HTTP
                                       error status or no answer (like ``curl -fsS``)
    python scripts/api_get.py --key    print the key run.sh uses (nothing when keys are off)

When TTS_API_KEYS is set (``key=per_minute,key2``) the request sends its first key as
``Authorization: Bearer <key>``. The key is read from the environment, never from the command
line, so that it does not show in ``ps``. Standard library only: it runs before anything is
imported from the project, under the venv's Python, so run.sh needs no curl.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 5.0


def first_key(spec: str) -> str:
    """Return the key of the first entry of ``key=per_minute,key2``, or "" when there is none.

    The entries are read as api/access.py's parse_keys reads them: split at commas, blanks
    stripped, empty entries skipped, the key being what comes before '='.
    """
    for item in filter(None, (part.strip() for part in spec.split(","))):
        return item.partition("=")[0].strip()
    return ""


def get(url: str, key: str) -> bytes:
    """Return the body of a 2xx answer to GET url; raise OSError for anything else."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            return bytes(answer.read())
    except urllib.error.HTTPError as e:
        detail = e.read(300).decode(errors="replace").strip()
        raise OSError(f"HTTP {e.code} from {url}: {detail}") from None


def main(argv: list[str]) -> int:
    key = first_key(os.environ.get("TTS_API_KEYS", ""))
    if argv == ["--key"]:
        if key:
            print(key)
        return 0
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        body = get(argv[0], key)
    except (OSError, ValueError) as e:  # refused, timed out, an error status, a malformed URL
        print(f"api_get: {e}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(body)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
