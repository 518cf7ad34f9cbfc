"""Logging set-up shared by the API and the workers."""

from __future__ import annotations

import logging


def setup_logging(level: str) -> None:
    """Log to stderr with time, level and logger name."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
