"""The table `make bench-store` writes: each row's cost and ceiling, and what the busiest row's ceiling means."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from bench.report import PUBLISHED, cell, run_label
from bench.store_figures import CommandCost, Window, gpu_rates, kept_bytes
from core.registry import load_registry
from core.settings import Settings

#: The primary's memory limit in deploy/compose.yaml (REDIS_MAXMEMORY's default): the store's budget follows it.
MAXMEMORY_GIB = 4
MAXMEMORY = f"{MAXMEMORY_GIB}gb"  # Redis's "gb" is 2**30 bytes


@dataclass(frozen=True)
class Measured:
    """What one row's run read from Redis: its version, the idle and the loaded window, its peak memory, and each
    command's cost over the loaded window."""

    redis_version: str
    idle: Window
    load: Window
    peak_memory: int
    commands: list[CommandCost]


@dataclass(frozen=True)
class Row(Measured):
    """One row: its setup, and what it measured."""

    workers: int
    callers: int
    fragment_ms: str
    replicas: int


def _kb(value: float | None) -> str:
    return cell(None if value is None else value / 1024, ".1f")


def table_line(row: Row) -> str:
    """Return one row of the table."""
    w = row.load
    return (
        f"| {row.workers} | {row.workers * row.callers} | {row.fragment_ms} | {row.replicas} | "
        f"{cell(w.per_segment(w.audio_s))} | "
        f"{cell(w.per_segment(w.fragments), '.1f')} | {w.segments_per_s:.0f} | {w.audio_per_s:.0f} | "
        f"{w.cpu_share:.0%} ({row.idle.cpu_share:.1%}) | {cell(w.per_audio_s(1000 * w.cpu_s))} | "
        f"{cell(w.per_segment(1000 * w.cpu_s))} | {cell(w.per_segment(w.commands), '.0f')} | "
        f"{_kb(w.per_audio_s(w.net_in))} / {_kb(w.per_audio_s(w.net_out))} | {_kb(w.per_audio_s(w.used_memory))} | "
        f"{cell(w.ceiling_audio_per_s, ',.0f')} | {cell(w.ceiling_segments_per_s, ',.0f')} | "
        f"{w.refused:.0f} / {w.errors:.0f} |"
    )


def fleet_lines(row: Row, settings: Settings) -> list[str]:
    """Return what the ceiling means: memory to keep the audio it makes, and the GPUs whose audio it takes."""
    w = row.load
    stored, ceiling = w.per_audio_s(w.used_memory), w.ceiling_audio_per_s
    if stored is None or ceiling is None:
        return []
    ttl = settings.audio_ttl_s
    trim_at = settings.store_trim_at
    kept_s = MAXMEMORY_GIB * 2**30 * trim_at / (ceiling * stored)
    at_ceiling, achieved = kept_bytes(ceiling, stored, ttl) / 2**30, kept_bytes(w.audio_per_s, stored, ttl) / 2**30
    lines = [
        f"- Keeping TTS_AUDIO_TTL_S ({ttl} s) of audio made at the {row.workers}-worker row's ceiling takes "
        f"{at_ceiling:,.1f} GiB of the primary's memory, at {_kb(stored)} KB per audio second; at its achieved rate, "
        f"{achieved:,.1f} GiB. A maxmemory of {MAXMEMORY} keeps {kept_s / 60:,.1f} minutes of the ceiling's audio "
        f"before its trim mark (TTS_STORE_TRIM_AT {trim_at:g}) removes the oldest finished audio.",
        f"- At that ceiling the primary's network carries {ceiling * (w.per_audio_s(w.net_in) or 0) * 8 / 1e9:.2f} "
        f"Gbit/s in and {ceiling * (w.per_audio_s(w.net_out) or 0) * 8 / 1e9:.2f} Gbit/s out (each replica adds about "
        "the traffic in to the traffic out: the replicas row).",
    ]
    published = PUBLISHED / "gpu_check.md"
    if not published.exists():
        return lines
    gpu_check = published.read_text(encoding="utf-8")
    latest = next((ln.strip("*. ") for ln in gpu_check.splitlines() if ln.startswith("*Latest run")), "undated")
    chattts = load_registry(settings).models.get("chattts")
    precision = chattts.precision if chattts is not None else "fp16"  # ChatTTS's own, as models.json declares it
    rates = [r for r in gpu_rates(gpu_check) if r.precision == precision]
    # The batch cap at its default, and the largest batch measured.
    batches = sorted({settings.batch_max_size, *([max(r.batch for r in rates)] if rates else [])})
    for rate in (r for r in rates if r.batch in batches):
        lines.append(
            f"- At that ceiling one primary takes the audio of {ceiling / rate.audio_per_s:,.0f} GPUs making "
            f"{rate.audio_per_s:g} audio s/s each: gpu_check.md's engine row {rate.precision}, batch {rate.batch} "
            f"({latest})."
        )
    return lines


def command_lines(row: Row, most: int = 8) -> list[str]:
    """Return where Redis's command time went in ``row``: its costliest commands, per segment."""
    scripts_s = sum(c.usec for c in row.commands if c.name in ("EVAL", "EVALSHA")) / 1e6
    lines = [
        "",
        f"Where the main thread's command time went in the {row.workers}-worker row (INFO commandstats; a script's "
        "own commands count within EVALSHA and again on their own lines):",
        "",
        "| command | calls per segment | µs per segment |",
        "|---|---|---|",
    ]
    lines += [
        f"| {c.name} | {cell(row.load.per_segment(c.calls), '.1f')} | {cell(row.load.per_segment(c.usec), '.0f')} |"
        for c in row.commands[:most]
    ]
    if row.load.cpu_s > 0:
        lines += [
            "",
            f"The scripts (EVALSHA: the job store's writes, in cache/scripts.py) took {scripts_s / row.load.cpu_s:.0%} "
            "of the main thread's CPU; the rest went to the other commands and to reading and writing its sockets.",
        ]
    return lines


def document(rows: list[Row], *, settings: Settings, codec_share: float, window_s: float, started: float) -> str:
    """Return the markdown result: the setup, the table, and what the ceiling of the busiest row at the default
    fragments means."""
    at_defaults = [row for row in rows if row.fragment_ms != "off" and not row.replicas]
    busiest = max(at_defaults or rows, key=lambda r: r.load.audio_s)
    lines = [
        "## The job store's ceiling: one Redis under the service's write path, an engine that makes audio at once",
        "",
        f"{os.cpu_count()} CPU cores shared by Redis {rows[0].redis_version} and the driver processes, each one "
        "worker wired as `python -m workers` and its closed-loop callers on the API's app through Flask's test "
        "client (each submits a job, then reads its events with fragments to the end). Settings at their defaults "
        "but: the sentence cache on a Redis of its own (TTS_CACHE_REDIS_URL, as the deploy files set it), the "
        f"primary's maxmemory {MAXMEMORY} (deploy/compose.yaml), and TTS_FRAGMENT_MS where a row says off. The "
        f"stand-in makes {settings.seconds_per_char:g} s of 24 kHz 16-bit audio a character (TTS_SECONDS_PER_CHAR): "
        f"eSpeak NG speech, of which the store's {settings.audio_store_codec} keeps {codec_share:.0%}; texts from the "
        f"bench corpus, a fresh seed each. {window_s:g} s windows; {run_label()}; ran "
        f"{time.perf_counter() - started:.0f} s.",
        "",
        "Redis CPU is its main thread's (INFO `used_cpu_*_main_thread`): busy share of one core during the window "
        "(idle, before the callers started, in brackets). The ceiling is the rate at which that thread would be busy "
        "all the time at the window's cost per audio second and per segment.",
        "",
        "| workers | callers | TTS_FRAGMENT_MS | replicas (Sentinel) | s per segment | fragments per segment | "
        "segments/s | audio s/s | Redis CPU (idle) | CPU ms per audio s | CPU ms per segment | commands per segment | "
        "KB in / out per audio s | KB stored per audio s | ceiling audio s/s | ceiling segments/s | refused / errors |",
        "|" + "---|" * 17,
        *(table_line(row) for row in rows),
        "",
        *fleet_lines(busiest, settings),
        *command_lines(busiest),
    ]
    return "\n".join(lines)
