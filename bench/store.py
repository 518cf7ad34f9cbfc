"""The job store's ceiling: the service's own write path against one Redis, an engine that makes audio at once.

    python -m bench.store [--workers 1,3] [--callers 8] [--window 15] [--no-fragments-off] [--replicas 2]

Each row starts a fresh primary Redis (devstack's production flags: AOF every second, noeviction; maxmemory 4gb as
deploy/compose.yaml), and a last row runs it as a Sentinel group's primary (two replicas, three Sentinels; the
service reaches it through them, and waits for a replica as it does there); the sentence cache is on a Redis of its
own (as the deploy files put it). Then driver
processes (bench/store_driver.py), each a worker wired as ``python -m workers`` wires it, with a stand-in engine
(bench/store_engine.py), and closed-loop callers on the API's own app. Redis's cost is read from INFO over the window:
its main thread's CPU, commands, network and memory, per segment and per audio second written. Since the drivers
share the machine's cores with Redis, they, not Redis, may limit the rate achieved: the ceiling is the audio rate
at which Redis's one command thread would be busy all the time, at the window's cost. Writes bench/results/ and
docs/benchmarks/results/store.md.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from bench.engine_limit import read_corpus
from bench.report import RESULTS, write_run
from bench.store_driver import DriverPlan, drive
from bench.store_engine import SAMPLE_RATE, speech_bank
from bench.store_figures import COUNTS, Reading, Window, command_costs
from bench.store_table import MAXMEMORY, Measured, Row, document
from core.audio import PackedAudio, to_pcm16
from core.registry import load_registry
from core.settings import Settings, load_settings
from devstack.redis_server import RedisServer
from devstack.sentinel import SentinelGroup
from workers.engines.base import SynthesisRequest
from workers.engines.factory import build_engine


@dataclass(frozen=True)
class Setup:
    """What one row runs: driver processes, the fragment schedule (None: the default), the primary's replicas."""

    workers: int
    fragment_ms: str | None = None
    replicas: int = 0


@dataclass(frozen=True)
class Work:
    """What the callers say and the stand-in speaks: corpus texts, and speech (float32 samples at 24 kHz)."""

    texts: list[str]
    speech: bytes


@dataclass(frozen=True)
class Timing:
    """How each row runs: callers per driver process, and the seconds idle, warming up and measured."""

    callers: int = 8
    idle_s: float = 3.0
    warmup_s: float = 3.0
    window_s: float = 15.0


def speech(settings: Settings, texts: list[str]) -> tuple[bytes, float]:
    """Return eSpeak NG's Mandarin speech of some corpus texts at 24 kHz (float32 bytes), and the share of raw PCM
    the store's codec keeps of it."""
    engine = build_engine(load_registry(settings).get("espeak-cmn"), device="cpu")
    engine.load()
    bank = speech_bank(engine.synthesize([SynthesisRequest(text=t) for t in texts[:20]]), engine.sample_rate)
    engine.unload()
    pcm = to_pcm16(bank)
    return bank.tobytes(), len(PackedAudio.pack(pcm, SAMPLE_RATE, settings.audio_store_codec).data) / len(pcm)


def reading(client: redis.Redis, counts: list[Any]) -> Reading:
    """Read Redis's INFO and the drivers' summed counts now."""
    summed = [0.0] * len(COUNTS)
    for array in counts:
        with array.get_lock():
            summed = [s + c for s, c in zip(summed, array[:], strict=True)]
    return Reading.of(client.info(), summed, time.monotonic())


@contextlib.contextmanager
def stores(replicas: int) -> Iterator[tuple[str, redis.Redis, str]]:
    """Run a primary as production runs it, and the sentence cache's Redis beside it; with ``replicas``, the primary
    of a Sentinel group as devstack starts one (that many replicas, three Sentinels). Yield the store's URL (the
    group's, with replicas), a client of the primary itself, and the cache's URL; remove them after."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-store-"))
    cache = RedisServer(workdir / "cache")
    group = SentinelGroup(workdir / "redis-ha", replicas=replicas) if replicas else None
    primary = group.nodes[0] if group is not None else RedisServer(workdir / "primary")
    try:
        cache.start()
        if group is not None:
            group.start()
        else:
            primary.start()
        client = redis.Redis.from_url(primary.url)
        client.config_set("maxmemory", MAXMEMORY)
        if group is not None:
            in_sync(client, group.nodes[1:])
        yield (group.url if group is not None else primary.url), client, cache.url
    finally:
        if group is not None:
            for copy in group.nodes[1:]:
                copy.kill()  # throwaway data; and a replica refuses SIGTERM while it writes its first AOF
            group.stop()
        else:
            primary.stop()
        cache.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def in_sync(primary: redis.Redis, copies: list[RedisServer], timeout_s: float = 60.0) -> None:
    """Wait until every replica is online and has written its first AOF, so no window measures a full sync."""
    deadline = time.monotonic() + timeout_s
    replicas = [redis.Redis(port=copy.port) for copy in copies]
    while time.monotonic() < deadline:
        online = [v for k, v in primary.info("replication").items() if k.startswith("slave")]
        if (
            len(online) == len(copies)
            and all(v.get("state") == "online" for v in online)
            and not any(
                r.info("persistence")["aof_rewrite_in_progress"] or r.info("persistence")["aof_rewrite_scheduled"]
                for r in replicas
            )
        ):
            return
        time.sleep(0.1)
    raise RuntimeError(f"the replicas were not in sync within {timeout_s:g} s")


def run_row(setup: Setup, timing: Timing, work: Work) -> Row:
    """Start the stores and the drivers; measure an idle window, then a loaded one."""
    with stores(setup.replicas) as (url, primary, cache):
        # With replicas the URL is the Sentinel group's: every write and answer waits for a replica (`auto`).
        env = {"REDIS_URL": url, "TTS_CACHE_REDIS_URL": cache}
        if setup.fragment_ms is not None:
            env["TTS_FRAGMENT_MS"] = setup.fragment_ms
        measured = measure(primary, env, setup.workers, timing, work)
    fragments = setup.fragment_ms or load_settings().fragment_ms
    row = Row(**vars(measured), workers=setup.workers, callers=timing.callers, fragment_ms=fragments,
              replicas=setup.replicas)  # fmt: skip
    load = row.load
    print(f"  {setup.workers} worker(s), fragments {fragments}, {setup.replicas} replica(s): "
          f"{load.segments_per_s:.0f} segments/s, {load.audio_per_s:.0f} audio s/s, Redis {load.cpu_share:.0%} of a "
          "core", flush=True)  # fmt: skip
    return row


def measure(client: redis.Redis, env: dict[str, str], workers: int, timing: Timing, work: Work) -> Measured:
    """Run ``workers`` drivers on the store ``env`` names: an idle window, then a loaded one."""
    context = mp.get_context("spawn")  # no driver inherits this process's connections or threads
    counts = [context.Array("d", len(COUNTS)) for _ in range(workers)]
    ready = [context.Event() for _ in range(workers)]
    go, stop = context.Event(), context.Event()
    plans = [DriverPlan(f"bench-store-{n}@{os.uname().nodename}", env, timing.callers, work.texts, work.speech,
                        seed=n + 1) for n in range(workers)]  # fmt: skip
    drivers = [context.Process(target=drive, args=(plan, counts[n], ready[n], go, stop), daemon=True)
               for n, plan in enumerate(plans)]  # fmt: skip
    try:
        for driver in drivers:
            driver.start()
        for driver, up in zip(drivers, ready, strict=True):
            if not up.wait(120) or not driver.is_alive():
                raise RuntimeError(f"a driver did not start (exit code {driver.exitcode})")
        before = reading(client, counts)
        time.sleep(timing.idle_s)
        idle = Window.between(before, reading(client, counts))
        go.set()
        time.sleep(timing.warmup_s)
        before, stats = reading(client, counts), client.info("commandstats")
        time.sleep(timing.window_s)
        load = Window.between(before, reading(client, counts))
        commands = command_costs(stats, client.info("commandstats"))
        peak = int(client.info("memory")["used_memory_peak"])
        version = str(client.info("server")["redis_version"])
    finally:
        go.set()
        stop.set()
        for driver in (d for d in drivers if d.pid is not None):  # started
            driver.join(15)
            if driver.is_alive():
                driver.terminate()
    return Measured(version, idle, load, peak, commands)


def main() -> None:
    """Measure each row and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,3", help="driver processes of each row, comma-separated")
    default = Timing()
    parser.add_argument("--callers", type=int, default=default.callers, help="closed-loop callers in each driver")
    parser.add_argument("--window", type=float, default=default.window_s, help="seconds measured in each row")
    parser.add_argument("--warmup", type=float, default=default.warmup_s, help="seconds of load before each window")
    parser.add_argument("--idle", type=float, default=default.idle_s, help="seconds with the workers up, no callers")
    parser.add_argument("--fragments-off", action=argparse.BooleanOptionalAction, default=True,
                        help="add a row at the most workers with TTS_FRAGMENT_MS=off")  # fmt: skip
    parser.add_argument("--replicas", type=int, default=2, help="add a row at the most workers, the primary with "
                        "this many replicas (0: none)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = time.perf_counter()
    settings = load_settings()
    texts = read_corpus()
    bank, codec_share = speech(settings, texts)
    counts = [int(n) for n in args.workers.split(",")]
    setups = [Setup(n) for n in counts]
    if args.fragments_off:
        setups.append(Setup(max(counts), fragment_ms="off"))
    if args.replicas:
        setups.append(Setup(max(counts), replicas=args.replicas))
    timing = Timing(args.callers, args.idle, args.warmup, args.window)
    rows = [run_row(setup, timing, Work(texts, bank)) for setup in setups]
    text = document(rows, settings=settings, codec_share=codec_share, window_s=args.window, started=started)
    out = args.out / f"store-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    write_run(out, "store", text, {"rows": [asdict(r) for r in rows], "codec_share": codec_share})
    print(text)


if __name__ == "__main__":
    main()
