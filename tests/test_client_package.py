"""The client as a package: `pip install .` gives the `client` package and a `tts` command that stand alone."""

from __future__ import annotations

import email.parser
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.apps import api_app
from tests.support.http import serving
from tests.support.servers import ROOT

#: What the client must run without: the server's packages and the heavy audio stack.
SERVER_ONLY = ("api", "cache", "core", "workers", "celery_config", "numpy", "soundfile", "torch", "flask", "redis")
#: Imported before anything else in a child interpreter: any import of SERVER_ONLY fails there.
BLOCKER = f"""
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SERVER_ONLY!r}:
            raise ImportError(f"the client imported {{name}}")
        return None
sys.meta_path.insert(0, Blocker())
"""
#: The installed client's dependencies and theirs (tqdm's colorama is for Windows only).
RUNTIME_DISTS = ("requests", "tqdm", "urllib3", "idna", "charset-normalizer", "certifi")
KEY = "package-test-key-0123456789abcdef"


def _build_wheel(out: Path) -> Path:
    """Build the project's wheel from a copy of what goes in it, so the checkout gets no build/ or egg-info."""
    source = out / "src"
    source.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", source / "pyproject.toml")
    shutil.copytree(ROOT / "client", source / "client", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the wheel once for the module."""
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_holds_the_client_and_declares_the_tts_command(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (info,) = {name.split("/")[0] for name in names if name.split("/")[0].endswith(".dist-info")}
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        metadata = email.parser.Parser().parsestr(archive.read(f"{info}/METADATA").decode())
    packages = {name.split("/")[0] for name in names} - {info}
    assert packages == {"client"}
    assert {"client/__init__.py", "client/__main__.py", "client/api.py", "client/cli.py"} <= set(names)
    assert "[console_scripts]\ntts = client.cli:main" in entry_points
    requires = metadata.get_all("Requires-Dist") or []
    plain = sorted(r.split("<")[0].split(">")[0].split("=")[0] for r in requires if "extra ==" not in r)
    assert plain == ["requests", "tqdm"]
    assert any(r.startswith("soundfile") and 'extra == "audio"' in r for r in requires)


def test_the_tqdm_pin_of_requirements_satisfies_the_package_and_is_what_runs() -> None:
    pins = dict(
        line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line.split("#")[0]
    )
    assert pins["tqdm"] == importlib.metadata.version("tqdm") == "4.70.1"
    assert '"tqdm>=4.70.1,<5"' in (ROOT / "pyproject.toml").read_text()


def test_the_client_runs_without_the_server_packages_numpy_or_soundfile(tmp_path: Path) -> None:
    script = BLOCKER + (
        "import client, client.cli, client.audio\n"
        "from client.audio import AudioSupportMissing, check_supported, encode\n"
        "check_supported('wav'); check_supported('pcm')\n"
        "assert encode(b'\\x00\\x01' * 100, 22050, 'wav')[:4] == b'RIFF'\n"
        "try:\n"
        "    check_supported('flac')\n"
        "except AudioSupportMissing as e:\n"
        "    print('missing:', e)\n"
        "client.cli.main(['--help'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "missing: writing flac files needs the soundfile package: pip install 'tts-queue[audio]'" in result.stdout
    assert "usage: tts" in result.stdout


def test_a_book_run_to_flac_without_soundfile_fails_at_once_with_how_to_install_it(tmp_path: Path) -> None:
    text_file = tmp_path / "chapter.txt"
    text_file.write_text("Hello.", encoding="utf-8")
    script = BLOCKER + "import sys, client.cli\nsys.exit(client.cli.main(sys.argv[1:]))\n"
    command = [sys.executable, "-c", script, "book", str(text_file), "-o", str(tmp_path / "c.flac")]
    # Nothing listens on port 9: had the command reached the service it would fail another way.
    result = subprocess.run(
        [*command, "--url", "http://127.0.0.1:9"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert "error: writing flac files needs the soundfile package" in result.stderr
    assert "Traceback" not in result.stderr


def test_python_m_client_from_the_checkout_still_works() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "client", "say", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m client say")
    assert "--api-key" in result.stdout


def _fresh_venv(root: Path, wheel: Path) -> Path:
    """Make a virtualenv that holds the wheel and its dependencies only, linked from this one (no network)."""
    venv.EnvBuilder(with_pip=False).create(root)
    python = root / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    deps = root / "deps"
    deps.mkdir()
    for name in RUNTIME_DISTS:
        dist = importlib.metadata.distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (deps / top).exists():
                (deps / top).symlink_to(source)
    (site_packages,) = (root / "lib").glob("python*/site-packages")
    (site_packages / "runtime-deps.pth").write_text(f"{deps}\n", encoding="utf-8")
    return root / "bin" / "tts"


@pytest.fixture(scope="module")
def keyed_server(settings_env: dict[str, str]) -> Iterator[str]:
    """Serve an API that accepts only ``KEY``."""
    app = api_app(settings_env, api_keys=KEY)
    with serving(app) as url:
        yield url


@pytest.fixture
def keyed_worked_url(keyed_server: str, redis_client: redis.Redis, worker: object) -> str:
    """Return the keyed API's URL with a real worker behind it, its jobs dropped before and after."""
    return keyed_server


@pytest.mark.slow
def test_the_installed_tts_command_runs_from_a_fresh_virtualenv_against_a_keyed_service(
    wheel: Path, tmp_path: Path, keyed_worked_url: str
) -> None:
    tts = _fresh_venv(tmp_path / "venv", wheel)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "TTS_URL": keyed_worked_url}

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(tts), *args],
            cwd=tmp_path,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    helped = run("--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: tts")
    assert "say" in helped.stdout and "book" in helped.stdout

    refused = run("say", "Hello from the installed command.", "-o", "refused.wav")
    assert refused.returncode == 1
    assert "pass --api-key KEY or set TTS_API_KEY" in refused.stderr

    said = run("say", "Hello from the installed command.", "-o", "hello.wav", TTS_API_KEY=KEY)
    assert said.returncode == 0, said.stderr
    assert (tmp_path / "hello.wav").read_bytes()[:4] == b"RIFF"
    text_file = tmp_path / "chapter.txt"
    text_file.write_text("One sentence here. And another one there.", encoding="utf-8")
    booked = run("book", str(text_file), "-o", "chapter.wav", "--api-key", KEY)
    assert booked.returncode == 0, booked.stderr
    assert re.search(r"(\d+)/\1 segments, [\d.]+ s audio, done in", booked.stderr), booked.stderr
    assert (tmp_path / "chapter.wav").read_bytes()[:4] == b"RIFF"
