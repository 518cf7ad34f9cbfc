"""The docs stay true: the README shows the two commands, and the configuration reference is generated."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

from core.settings import Settings, env_name
from tests.support.servers import ROOT


def _config_reference() -> ModuleType:
    """Import scripts/config_reference.py (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_shows_the_two_commands_on_its_first_screen() -> None:
    first_screen = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:30])
    assert "make run" in first_screen
    assert "make test" in first_screen


def test_the_configuration_reference_is_what_the_settings_generate() -> None:
    reference = _config_reference()
    written = reference.PAGE.read_text(encoding="utf-8")
    assert written == reference.render(), "stale: run .venv/bin/python -m scripts.config_reference"


def test_the_configuration_reference_names_every_setting_by_its_variable() -> None:
    page = _config_reference().render()
    assert [name for name in Settings.model_fields if f"| `{env_name(name)}` |" not in page] == []
    assert "| `REDIS_URL` |" in page


def test_the_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 150


def test_the_top_level_documents_link_only_to_files_that_exist() -> None:
    missing = [
        f"{name}: {target}"
        for name in ("README.md", "ARCHITECTURE.md", "CONTRIBUTING.md", "deploy/README.md")
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", (ROOT / name).read_text(encoding="utf-8"))
        if not ((ROOT / name).parent / target).exists()
    ]
    assert missing == []
