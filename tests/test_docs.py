"""The README stays true: it names both commands and every setting the service reads."""

from __future__ import annotations

from core.settings import Settings
from tests.support.servers import ROOT


def test_the_readme_documents_every_setting() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [
        name
        for name in ("REDIS_URL" if f == "redis_url" else f"TTS_{f.upper()}" for f in Settings.model_fields)
        if f"`{name}`" not in readme
    ]
    assert missing == []


def test_the_readme_shows_the_two_commands_first() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.index("make run") < readme.index("## Configuration")
    assert readme.index("make test") < readme.index("## Configuration")
