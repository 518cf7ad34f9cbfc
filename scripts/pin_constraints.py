"""Write constraints.txt: every package the requirements files pull in, at the version tested.

    .venv/bin/python scripts/pin_constraints.py          (make constraints) rewrite constraints.txt
    .venv/bin/python scripts/pin_constraints.py --check  exit 1 if it is out of date

requirements*.txt pin what the project names; what those pull in (ChatTTS alone brings
torchaudio, vocos, numba, vector_quantize_pytorch, pybase16384, ...) would otherwise resolve to
whatever is newest on the day of the install. The versions come from the virtual environment
this runs in, the one the tests passed in. A package that environment lacks (the benchmark's
chart when only `make install-dev` ran) is pinned at what ``pip install --dry-run`` resolves
beside the installed ones. scripts/install.sh hands the file to every pip install (``-c``).

torch is written without its local build tag: ``torch==2.13.0`` is met by the CPU build
(2.13.0+cpu) and by the CUDA one alike, and install.sh picks which.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"
#: In the order of the sections: a package is listed under the first file that pulls it in.
REQUIREMENT_FILES = ("requirements.txt", "requirements-dev.txt", "requirements-bench.txt")
#: The other Pythons the service is installed with (Debian 12, Ubuntu 24.04, Debian 13): what only they
#: pull in (redis wants async-timeout below 3.11.3) is pinned too, under the marker that pulls it in.
OTHER_PYTHONS = ("3.11.2", "3.12.3", "3.13.5")
TITLES = {
    "requirements.txt": "What the service runs on: requirements.txt and all it pulls in.",
    "requirements-dev.txt": "Tests and lint (make install-dev): what requirements-dev.txt adds.",
    "requirements-bench.txt": "Benchmarks (make install-bench): what requirements-bench.txt adds.",
}


@dataclass(frozen=True)
class Dist:
    """One distribution: its name as published, its version, what it requires."""

    name: str
    version: str
    requires: tuple[str, ...]


def read_requirements(path: Path) -> list[Requirement]:
    """Return the requirements of one requirements file (comments and blank lines skipped)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def installed() -> dict[str, Dist]:
    """Return the distributions of this environment by canonical name."""
    found: dict[str, Dist] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        found[canonicalize_name(name)] = Dist(name, dist.version, tuple(dist.requires or ()))
    return found


def environments() -> list[dict[str, str]]:
    """Return the marker environment here, then those of the other Pythons the service installs on."""
    here: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    return [here] + [{**here, "python_full_version": v, "python_version": v.rsplit(".", 1)[0]} for v in OTHER_PYTHONS]


def resolved_beside(present: Mapping[str, Dist], files: Iterable[Path], more: Iterable[str]) -> dict[str, Dist]:
    """Return what pip would add to this environment for the files and requirements, the present versions held."""
    with tempfile.TemporaryDirectory() as tmp:
        held, report = Path(tmp) / "held.txt", Path(tmp) / "report.json"
        held.write_text("".join(f"{d.name}=={d.version}\n" for key, d in present.items() if key != "pip"))
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
                   "--constraint", str(held), *more]  # fmt: skip
        for path in files:
            command += ["--requirement", str(path)]
        subprocess.run(command, check=True)
        items = json.loads(report.read_text(encoding="utf-8"))["install"]
    return {
        canonicalize_name(item["metadata"]["name"]): Dist(
            item["metadata"]["name"], item["metadata"]["version"], tuple(item["metadata"].get("requires_dist") or ())
        )
        for item in items
    }


@dataclass
class Closure:
    """What some requirements pull in: here, only on the other Pythons (with the markers), and unknown."""

    here: set[str]
    elsewhere: dict[str, set[str]]  # canonical name → the markers of the requirements that pull it in
    wanted_elsewhere: set[str]  # those requirements, markers dropped, for pip to resolve
    missing: set[str]  # neither installed nor resolved


def closure(roots: Iterable[Requirement], dists: Mapping[str, Dist]) -> Closure:
    """Walk the roots' requirements, extras honoured, markers evaluated here and on the other Pythons."""
    envs = environments()
    found = Closure(set(), {}, set(), set())
    seen: set[tuple[str, str, str]] = set()
    todo: list[tuple[Requirement, str, str]] = [(req, "", "") for req in roots]  # (req, extra, marker elsewhere)
    while todo:
        req, extra, via = todo.pop()
        if req.marker is not None and not via and not req.marker.evaluate({**envs[0], "extra": extra}):
            if not any(req.marker.evaluate({**env, "extra": extra}) for env in envs[1:]):
                continue
            via = str(req.marker)  # pulled in only on another Python
            found.wanted_elsewhere.add(f"{req.name}{req.specifier}")
        name = canonicalize_name(req.name)
        for wanted in ("", *sorted(req.extras)):
            if (name, wanted, via) in seen:
                continue
            seen.add((name, wanted, via))
            if via:
                found.elsewhere.setdefault(name, set()).add(via)
            else:
                found.here.add(name)
            dist = dists.get(name)
            if dist is None:
                found.missing.add(name)
                continue
            todo += [(Requirement(line), wanted, via) for line in dist.requires]
    for here in found.here:
        found.elsewhere.pop(here, None)
    return found


def _pin(dist: Dist, markers: Iterable[str] = ()) -> str:
    line = f"{dist.name}=={Version(dist.version).public}"
    markers = sorted(markers)
    return line if not markers else f"{line} ; " + " or ".join(f"({m})" if len(markers) > 1 else m for m in markers)


def _by_name(line: str) -> str:
    return line.split("==", 1)[0].lower()


def render(dists: Mapping[str, Dist]) -> str:
    """Return the text of constraints.txt for these distributions."""
    lines = [
        "# Generated by scripts/pin_constraints.py (make constraints) from the tested virtual environment;",
        "# regenerate rather than edit. Every package requirements*.txt pull in, at the version tested:",
        "# scripts/install.sh installs with `pip install -c constraints.txt`, so a fresh install resolves",
        "# to this set. torch carries no local tag: its CPU (+cpu) and CUDA builds both satisfy the pin.",
    ]
    listed: set[str] = set()
    elsewhere: dict[str, set[str]] = {}
    for file in REQUIREMENT_FILES:
        walk = closure(read_requirements(ROOT / file), dists)
        if walk.missing:
            raise SystemExit(f"{file}: neither installed nor resolvable: {sorted(walk.missing)}")
        names = walk.here - listed
        listed |= names
        for name, markers in walk.elsewhere.items():
            elsewhere.setdefault(name, set()).update(markers)
        lines += ["", f"# {TITLES[file]}"]
        lines += sorted((_pin(dists[n]) for n in names), key=_by_name)
    if elsewhere.keys() - listed:
        lines += ["", f"# Only on other Pythons ({', '.join(OTHER_PYTHONS)}: Debian 12, Ubuntu 24.04, Debian 13)."]
        lines += sorted((_pin(dists[n], elsewhere[n]) for n in elsewhere.keys() - listed), key=_by_name)
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    present = installed()
    files = [ROOT / f for f in REQUIREMENT_FILES]
    wanted = set().union(*(closure(read_requirements(f), present).wanted_elsewhere for f in files))
    added = resolved_beside(present, files, sorted(wanted))
    changed = sorted(n for n in added if n in present)
    if changed:
        print(f"pip would replace installed packages: {changed}; run make install-bench first", file=sys.stderr)
        return 1
    if added:
        print(f"not installed here, pinned as pip resolves them now: {sorted(d.name for d in added.values())}")
    text = render({**present, **added})
    if argv == ["--check"]:
        old = CONSTRAINTS.read_text(encoding="utf-8") if CONSTRAINTS.exists() else ""
        if old == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True), "constraints.txt",
                                                   "as generated"))  # fmt: skip
        print("constraints.txt is out of date: make constraints", file=sys.stderr)
        return 1
    CONSTRAINTS.write_text(text, encoding="utf-8")
    print(f"wrote {CONSTRAINTS.relative_to(ROOT)}: {text.count('==')} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
