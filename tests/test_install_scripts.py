"""The install and start scripts: what they check for before starting, the pinned versions, a keyed `make run`."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import redis
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.processes import wait_for
from tests.support.run_script import RunScript, supervisorctl_or_skip
from tests.support.servers import ROOT

REQUIREMENT_FILES = sorted(ROOT.glob("requirements*.txt"))
CONSTRAINTS = ROOT / "constraints.txt"
MINOR = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _requirements(path: Path) -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def _script_module(name: str) -> ModuleType:
    """Import scripts/<name>.py (scripts/ is no package)."""
    if f"scripts.{name}" not in sys.modules:
        spec = importlib.util.spec_from_file_location(f"scripts.{name}", ROOT / "scripts" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        sys.modules[spec.name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[f"scripts.{name}"]


def _pins() -> dict[str, Version]:
    """Return constraints.txt as canonical name → pinned version, checking each line pins one version."""
    pins: dict[str, Version] = {}
    for req in _requirements(CONSTRAINTS):
        (spec,) = req.specifier
        assert spec.operator == "==" and not req.extras, f"not an exact pin: {req}"
        assert req.marker is None or "extra" not in str(req.marker), f"a pin for an extra: {req}"
        name = canonicalize_name(req.name)
        assert name not in pins, f"{req.name} is pinned twice"
        pins[name] = Version(spec.version)
    return pins


def _other_pythons() -> list[dict[str, str]]:
    """Return the marker environments of the other Pythons scripts/pin_constraints.py pins for."""
    return list(_script_module("pin_constraints").environments()[1:])


def _pulled_in(roots: list[Requirement]) -> tuple[set[str], set[str], set[str]]:
    """Return the canonical names the roots pull in here (extras and markers honoured), those of them not
    installed, and those only another Python pulls in (redis's async-timeout below 3.11.3: Debian 12's 3.11.2).
    """
    others = _other_pythons()
    seen: set[tuple[str, str]] = set()
    absent: set[str] = set()
    elsewhere: set[str] = set()
    todo = [(req, "") for req in roots]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            if any(req.marker.evaluate({**env, "extra": extra}) for env in others):
                elsewhere.add(canonicalize_name(req.name))
            continue
        name = canonicalize_name(req.name)
        for wanted in ("", *sorted(req.extras)):
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            try:
                requires = importlib.metadata.requires(req.name) or []
            except importlib.metadata.PackageNotFoundError:
                absent.add(name)
                continue
            todo += [(Requirement(line), wanted) for line in requires]
    return {name for name, _ in seen}, absent, elsewhere


def test_the_constraints_file_pins_each_package_once_and_torch_without_a_build_tag() -> None:
    pins = _pins()
    assert pins, "constraints.txt pins nothing"
    assert not [n for n, v in pins.items() if v.local], "a local tag (+cpu) would refuse the CUDA build"
    install_sh = (ROOT / "scripts" / "install.sh").read_text(encoding="utf-8").splitlines()
    (torch_version,) = [line.split("=", 1)[1] for line in install_sh if line.startswith("TORCH_VERSION=")]
    assert pins["torch"] == Version(torch_version), "constraints.txt and scripts/install.sh name other torch versions"


def test_the_constraints_agree_with_every_version_the_requirements_files_pin() -> None:
    pins = _pins()
    disagree = {
        f"{path.name}: {req}": str(pins.get(canonicalize_name(req.name)))
        for path in REQUIREMENT_FILES
        for req in _requirements(path)
        for spec in req.specifier
        if spec.operator == "==" and pins.get(canonicalize_name(req.name)) != Version(spec.version)
    }
    assert not disagree, f"re-pin with `make constraints`: {disagree}"


def test_every_package_the_requirements_pull_in_is_pinned_at_the_version_installed_here() -> None:
    pins = _pins()
    runtime, _, on_debian_12 = _pulled_in(_requirements(ROOT / "requirements.txt"))
    # What ChatTTS pulls in unpinned: the walk must reach it.
    assert {"torchaudio", "vocos", "numba", "vector-quantize-pytorch", "pybase16384", "llvmlite"} <= runtime
    assert "async-timeout" in on_debian_12 | runtime
    for path in REQUIREMENT_FILES:
        names, absent, elsewhere = _pulled_in(_requirements(path))
        unpinned = sorted((names | elsewhere) - pins.keys())
        assert not unpinned, f"{path.name} pulls in packages constraints.txt lacks (make constraints): {unpinned}"
        differ = {
            name: f"installed {importlib.metadata.version(name)}, pinned {pins[name]}"
            for name in sorted(names - absent)
            if Version(Version(importlib.metadata.version(name)).public) != pins[name]
        }
        assert not differ, f"the venv is not the pinned set (make install-dev, or make constraints): {differ}"
        if path.name != "requirements-bench.txt":  # the tests run with the runtime and test tools installed
            assert not absent, f"not installed: {sorted(absent)}"


# --- What install.sh and run.sh check for before starting (scripts/prereqs.sh) ---


def _executable(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)


@dataclass
class Machine:
    """The environment to run a script in, and the log of what apt was asked."""

    env: dict[str, str]
    log: Path


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    """A Python without ensurepip, and stand-ins for id, dpkg, apt-cache and apt-get that log what they are asked.

    The stand-in apt-get "installs" python3.X-venv by lifting the module that hides ensurepip.
    """
    shadow = tmp_path / "no-ensurepip"
    (shadow / "ensurepip").mkdir(parents=True)
    (shadow / "ensurepip" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'ensurepip'\")\n")
    fake, log = tmp_path / "bin", tmp_path / "apt.log"
    fake.mkdir()
    _executable(fake / "id", '#!/bin/sh\necho "${FAKE_UID:-1000}"\n')
    _executable(fake / "dpkg", "#!/bin/sh\nexit 0\n")
    _executable(fake / "apt-cache", f'#!/bin/sh\necho "apt-cache $*" >>{log}\nexit 100\n')
    _executable(fake / "apt-get", f'#!/bin/sh\necho "apt-get $*" >>{log}\n'
                                  f'case "$*" in install*) rm -rf {shadow / "ensurepip"};; esac\n')  # fmt: skip
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "PYTHONPATH": str(shadow),
           "PYTHON": sys.executable, "PREREQS_SYSTEM_PREFIX": sys.base_prefix}  # fmt: skip
    return Machine(env, log)


def _bash(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip


def test_install_without_ensurepip_names_the_debian_package_to_install_and_creates_no_venv(
    machine: Machine, tmp_path: Path
) -> None:
    env = {**machine.env, "VENV": str(tmp_path / "venv")}
    answer = _bash(["scripts/install.sh", "requirements.txt"], env)
    assert answer.returncode == 1, answer.stdout + answer.stderr
    assert f"Python {MINOR} cannot create a virtual environment (no ensurepip)" in answer.stderr
    assert f"sudo apt-get install python{MINOR}-venv" in answer.stderr
    assert not (tmp_path / "venv").exists()
    assert not machine.log.exists(), "apt-get ran for a user who cannot install"


def test_as_root_a_missing_venv_package_is_installed_with_apt_get_after_fetching_the_package_lists(
    machine: Machine,
) -> None:
    env = {**machine.env, "FAKE_UID": "0"}
    answer = _bash(["-c", '. scripts/prereqs.sh && need_venv_support "$PYTHON"'], env)
    assert answer.returncode == 0, answer.stdout + answer.stderr
    assert f"installing Debian's python{MINOR}-venv" in answer.stdout
    assert machine.log.read_text().splitlines() == [
        f"apt-cache show python{MINOR}-venv",
        "apt-get update -qq",
        f"apt-get install -y -qq python{MINOR}-venv",
    ]


def test_a_python_that_is_not_the_distributions_is_not_fixed_with_apt_get_but_named(
    machine: Machine,
) -> None:
    env = {**machine.env, "FAKE_UID": "0", "PREREQS_SYSTEM_PREFIX": "/no/such/prefix"}
    answer = _bash(["-c", '. scripts/prereqs.sh && need_venv_support "$PYTHON"'], env)
    assert answer.returncode == 1
    assert f"(Python {MINOR} in {sys.base_prefix}) cannot create a virtual environment" in answer.stderr
    assert "PYTHON=/usr/bin/python3 make install" in answer.stderr
    assert not machine.log.exists()


def test_install_with_no_such_python_says_what_to_install(machine: Machine, tmp_path: Path) -> None:
    env = {**machine.env, "VENV": str(tmp_path / "venv"), "PYTHON": "no-such-python3"}
    answer = _bash(["scripts/install.sh", "requirements.txt"], env)
    assert answer.returncode == 1
    assert "no-such-python3 not found: the service needs Python 3.11 or newer." in answer.stderr
    assert "sudo apt-get install python3 python3-venv" in answer.stderr


def test_run_without_a_virtual_environment_says_make_install_and_starts_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "VENV": str(tmp_path / "no-venv"), "TTS_RUN_DIR": str(tmp_path / "run")}
    answer = _bash(["scripts/run.sh"], env)
    assert answer.returncode == 1
    assert f"{tmp_path}/no-venv/bin/python is missing: create the virtual environment first with:" in answer.stderr
    assert "make install" in answer.stderr
    assert not (tmp_path / "run").exists()


def test_run_with_a_malformed_tts_api_keys_stops_with_the_reason_before_starting_anything(tmp_path: Path) -> None:
    env = {**os.environ, "TTS_API_KEYS": "k1=600,k2", "TTS_RUN_DIR": str(tmp_path / "run")}
    answer = _bash(["scripts/run.sh"], env)
    assert answer.returncode == 1
    assert "the service would refuse its settings; nothing was started:" in answer.stderr
    assert "TTS_API_KEYS" in answer.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("spec", "key"),
    [("k1=600,k2", "k1"), ("k1", "k1"), (" k1 = 5 ,k2", "k1"), ("", ""), (" ", "")],
)
def test_run_reads_the_api_with_the_first_key_of_tts_api_keys(spec: str, key: str) -> None:
    assert _script_module("api_get").first_key(spec) == key


# --- One real `make run`: keys on, an absolute TTS_RUN_DIR ---


def _post(url: str, body: dict[str, object], headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.mark.slow
def test_make_run_with_api_keys_and_an_absolute_run_dir_starts_and_its_curl_examples_send_the_first_key(
    tmp_path: Path,
) -> None:
    supervisorctl = supervisorctl_or_skip()
    run_dir = tmp_path / "absolute-run-dir"
    assert run_dir.is_absolute()
    key = "e2e-first-key-7f3a9c"
    run = RunScript(run_dir, supervisorctl, {"TTS_API_KEYS": f" {key}=600, e2e-second-key-0d41aa"})
    try:
        wait_for(lambda: "Press Ctrl-C to stop." in run.text or run.process.poll() is not None, 120, "make run ready")
        assert run.process.poll() is None, run.text[-4000:]
        text, api = run.text, f"http://127.0.0.1:{run.api_port}"

        # Redis keeps its data in the absolute folder itself, not under the repository.
        assert f"data in {run_dir}/redis" in text
        with redis.Redis(port=run.redis_port) as client:
            served_dir = client.config_get("dir")["dir"]
        assert os.path.realpath(served_dir) == os.path.realpath(run_dir / "redis")

        # Every curl example sends the first key, and the service takes it.
        header = f"Authorization: Bearer {key}"
        assert text.count(f"-H '{header}'") == 4, text[-2000:]
        assert "API keys are on (TTS_API_KEYS): the examples send the first one." in text
        assert _post(f"{api}/v1/jobs", {"text": "Hello there."}, {})[0] == 401
        status, job = _post(f"{api}/v1/jobs", {"text": "Hello there."}, {"Authorization": f"Bearer {key}"})
        assert status == 202, job
        if shutil.which("curl"):  # the printed example itself, as pasted into a shell
            lines = text.splitlines()
            start = next(i for i, line in enumerate(lines) if line.strip().startswith("curl -s -X POST"))
            end = next(i for i in range(start, len(lines)) if not lines[i].endswith("\\"))
            pasted = _bash(["-c", "\n".join(lines[start : end + 1])], dict(os.environ))
            assert "id" in json.loads(pasted.stdout), pasted.stdout + pasted.stderr

        # run.sh's stand-in for curl: the key from the environment, a refusal said plainly without it.
        probe = [sys.executable, "scripts/api_get.py", f"{api}/v1/models"]
        env = {k: v for k, v in os.environ.items() if k != "TTS_API_KEYS"}
        refused = subprocess.run(probe, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, check=False)
        assert refused.returncode == 1 and "HTTP 401 from" in refused.stderr
        keyed = subprocess.run(probe, cwd=ROOT, env={**env, "TTS_API_KEYS": f"{key}=600"}, capture_output=True,
                               text=True, timeout=30, check=False)  # fmt: skip
        assert keyed.returncode == 0 and json.loads(keyed.stdout)["default"] == "espeak-en"

        # The key is on run.sh's output only: in no file the stack wrote.
        written = [p for p in run_dir.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
        assert not written, written
    finally:
        run.close()
