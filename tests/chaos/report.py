"""Print the fault scenarios' latest results as a markdown table: ``python -m tests.chaos.report [file]``.

From the default results file (``make chaos``), the table is also published to docs/benchmarks/results/chaos.md;
``--failover`` tabulates only the Sentinel scenarios (``make chaos-failover``) and publishes them to failover.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.report import publish
from tests.chaos.audit import RESULTS

COLUMNS = (
    ("scenario", "scenario"),
    ("accepted", "accepted"),
    ("done", "done"),
    ("failed", "failed (reason)"),
    ("lost", "lost"),
    ("duplicated", "duplicated segments"),
    ("affected", "in flight at the fault"),
    ("recovery_p99_s", "recovery p99 (s)"),
    ("recovery_s", "recovery, all (s)"),
    ("ready_again_s", "/readyz 200 again (s)"),
    ("accepting_again_s", "202 again (s)"),
    ("refused_meanwhile", "503s meanwhile"),
    ("seconds", "whole scenario (s)"),
    ("notes", "notes"),
)


def latest_rows(path: Path) -> list[dict[str, Any]]:
    """Return the newest row of each scenario in the results file, by scenario name."""
    latest: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                latest[row["scenario"]] = row
    return [latest[name] for name in sorted(latest)]


def table(rows: list[dict[str, Any]]) -> str:
    """Render rows as a markdown table."""
    lines = [
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|" + "|".join("---" if key in ("scenario", "notes") else "---:" for key, _ in COLUMNS) + "|",
    ]
    for row in rows:
        cells = ("–" if row.get(key) is None else str(row[key]).replace("|", "/") for key, _ in COLUMNS)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The Sentinel failover scenarios' names begin with this (tests/chaos/test_failover.py).
FAILOVER_PREFIX = "l"


def main(argv: list[str]) -> int:
    """Print the table (and publish it, from the default file); say so when there are no results yet."""
    failover = "--failover" in argv
    files = [arg for arg in argv if arg != "--failover"]
    path = Path(files[0]) if files else RESULTS
    rows = [row for row in latest_rows(path) if not failover or row["scenario"].startswith(FAILOVER_PREFIX)]
    if not rows:
        print(f"no chaos results in {path}; run `make {'chaos-failover' if failover else 'chaos'}`")
        return 1
    print(table(rows))
    if not files:
        publish("failover" if failover else "chaos", table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
