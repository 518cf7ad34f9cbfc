"""`make soak`: drive a `make run` stack at saturation for a long while and watch what grows.

Closed-loop callers submit a mix of short, paragraph-length and a few book-length jobs (most follow their
job's event stream, some download the whole audio), backing off as admission says. Every sample interval it
prints Redis's used memory against its budget, the API's and the workers' resident memory (every process of
each, model hosts included), jobs finished per second, admission answers and errors. At the
end it waits for every accepted job to end and says whether the targets held:

- Redis memory levels off below its budget;
- API and worker RSS grow less than 5% after warm-up (the first third of the run), read from a least-squares line
  through the samples after it (RSS saws by ±10 MB as buffers come and go);
- no errors other than deliberate admission answers (429/503), and every accepted job is done.

    python -m bench.soak [--minutes 30] [--callers 24] [--sample-s 30]

It runs scripts/run.sh exactly as `make run` does (default model, Redis maxmemory, two API processes), in
var/soak/ on ports of its own. Results go to bench/results/soak.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import threading
import time

import redis

from bench.report import save_result
from bench.soak_callers import Caller, Tally
from bench.soak_samples import HEADER, SEPARATOR, Sample, private_growth, row, sample, stored_ratio, verdicts
from devstack.local import ROOT
from devstack.run_script import RunScript, readyz


def parse_args() -> argparse.Namespace:
    """Read the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", "30")))
    parser.add_argument("--callers", type=int, default=24)
    parser.add_argument("--books", type=int, default=2, help="callers that submit only book-length jobs")
    parser.add_argument("--sample-s", type=float, default=30.0)
    return parser.parse_args()


def start_stack() -> RunScript:
    """Start `make run` in a fresh var/soak/ (a fresh Redis: the soak measures growth from nothing)."""
    run_dir = ROOT / "var" / "soak"
    shutil.rmtree(run_dir, ignore_errors=True)
    return RunScript(run_dir, ROOT / ".venv" / "bin" / "supervisorctl",
                     env={"TTS_DEFAULT_MODEL": os.environ.get("TTS_DEFAULT_MODEL", "espeak-cmn"),
                          "TTS_API_PROCESSES": os.environ.get("TTS_API_PROCESSES", "2")})  # fmt: skip


def came_up(stack: RunScript) -> bool:
    """Wait until `make run` says it is ready; print its output and say no if it ended or took too long."""
    deadline = time.monotonic() + 180
    while "==> ready" not in stack.text:
        if time.monotonic() > deadline or stack.process.poll() is not None:
            print(stack.text)
            return False
        time.sleep(0.5)
    return True


def saturate(stack: RunScript, store: redis.Redis, args: argparse.Namespace, tally: Tally) -> tuple[list[Sample], bool]:
    """Run the callers for the soak's minutes, sampling as they go, then drain; return the samples and if it did."""
    stop = threading.Event()
    callers = [Caller(stack.api_port, tally, seed, stop, books=seed < args.books) for seed in range(args.callers)]
    threads = [threading.Thread(target=c.run, daemon=True) for c in callers]
    started = time.monotonic()
    for t in threads:
        t.start()
    print(f"soak: {args.callers} callers ({args.books} of them books) for {args.minutes:g} min on `make run`\n")
    print(HEADER)
    print(SEPARATOR)
    samples: list[Sample] = []
    last = (started, 0)
    while time.monotonic() - started < args.minutes * 60:
        stop.wait(args.sample_s)
        samples.append(sample(stack, store, tally, started, last))
        last = (time.monotonic(), tally.done)
        print(row(samples[-1]), flush=True)
    stop.set()
    drain_until = time.monotonic() + 600
    for t in threads:
        t.join(max(0.0, drain_until - time.monotonic()))
    drained = not any(t.is_alive() for t in threads)
    samples.append(sample(stack, store, tally, started, last))
    print(row(samples[-1]) + " (drained)")
    return samples, drained


def main() -> int:
    """Soak `make run`, print what grew and the verdicts, write bench/results/soak.md; exit 1 if a target failed."""
    args = parse_args()
    stack = start_stack()
    try:
        if not came_up(stack):
            return 1
        assert readyz(stack.api_port) is not None
        store = redis.Redis(port=stack.redis_port)
        tally = Tally()
        samples, drained = saturate(stack, store, args, tally)
        results = verdicts(samples, tally, drained)
        per_second, share = stored_ratio(store)
        stored = f"{per_second / 1024:.1f} KB per audio second stored, {share:.0%} of raw 16-bit PCM"
        print()
        for target, held, figures in results:
            print(f"{'PASS' if held else 'FAIL'}  {target}: {figures}")
        print(f"      {stored} (TTS_AUDIO_STORE_CODEC; lossless FLAC cannot reach half, see README)")
        print(f"      {private_growth(samples)}")
        for error in tally.errors[:10]:
            print("  error:", error)
        write_results(args, samples, results, tally, stored)
        return 0 if all(held for _, held, _ in results) else 1
    finally:
        stack.close()


def write_results(args: argparse.Namespace, samples: list[Sample], results: list[tuple[str, bool, str]],
                  tally: Tally, stored: str) -> None:  # fmt: skip
    """Write the samples, the verdicts and the figures to bench/results/soak.md."""
    lines = [
        "# Soak (`make soak`)",
        "",
        f"{args.callers} closed-loop callers ({args.books} submitting book-length jobs) for {args.minutes:g} min on "
        "`make run` at its defaults. Generated by `python -m bench.soak`.",
        "",
        HEADER,
        SEPARATOR,
        *[row(s) for s in samples],
        "",
        *[f"- {'PASS' if held else 'FAIL'} {target}: {figures}" for target, held, figures in results],
        f"- {stored} (TTS_AUDIO_STORE_CODEC; lossless FLAC cannot reach half, see README)",
        f"- {private_growth(samples)}",
        f"- median jobs/s over the run: {statistics.median(s.jobs_s for s in samples[:-1] or samples):.2f}; "
        f"{tally.downloads} whole-audio downloads",
    ]
    save_result("soak", "\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
