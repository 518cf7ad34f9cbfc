"""Render the headline results as markdown: after versus before per level, the engine's limit, the targets."""

from __future__ import annotations

import functools
from typing import Any

from core.settings_worker import WorkerSettings

#: (label, summary key, format, higher is better)
ROWS: tuple[tuple[str, str, str, bool], ...] = (
    ("completed jobs/s", "jobs_per_s", "{:.2f}", True),
    ("characters/s", "chars_per_s", "{:.1f}", True),
    ("mean characters a job (of those finished in the window)", "mean_chars_done", "{:.1f}", False),
    ("jobs/s at the corpus's mean length (characters/s ÷ its mean per text)", "jobs_per_s_at_mix", "{:.2f}", True),
    ("p50 submit→done (s)", "latency_p50", "{:.2f}", False),
    ("p90 submit→done (s)", "latency_p90", "{:.2f}", False),
    ("p99 submit→done (s)", "latency_p99", "{:.2f}", False),
    ("p50 submit→first audio (s)", "first_audio_p50", "{:.2f}", False),
    ("p99 submit→first audio (s)", "first_audio_p99", "{:.2f}", False),
    ("jobs with a playback stall", "stall_share", "{:.1%}", False),
    ("p99 total stall (s)", "stall_p99_s", "{:.2f}", False),
    ("mean batch size", "mean_batch_size", "{:.2f}", True),
    ("engine busy (batches ending in the window ÷ window)", "engine_busy", "{:.0%}", True),
    ("audio made, s per s (every segment written in the window)", "audio_made_per_s", "{:.1f}", True),
    ("mean wait, submit→segment task starts (s)", "queue_wait_mean_s", "{:.2f}", False),
    ("segments queued in the broker (mean / max)", "queue", "", False),
    ("jobs measured", "jobs_measured", "{}", True),
    ("CPU busy % (ours / others)", "cpu", "", False),
    ("CPU by part, % of one core", "cpu_roles", "", False),
    ("machine pace before the window (× the run's start; bench/pace_probe.py)", "machine_pace", "{:.2f}×", True),
)


def _fmt(value: Any, pattern: str) -> str:
    if value is None:
        return "–"
    if isinstance(value, dict):
        if "queue_mean" in value:
            return f"{value['queue_mean']:.1f} / {value['queue_max']}"
        if "busy_pct" in value:
            return f"{value['busy_pct']:.0f} ({value['ours_pct']:.0f} / {value['others_pct']:.0f})"
        return ", ".join(f"{role} {pct:.0f}" for role, pct in value.items()) or "–"
    return pattern.format(value)


def _ratio(after: Any, before: Any) -> str:
    if not isinstance(after, int | float) or not isinstance(before, int | float) or not before:
        return "–"
    return f"{after / before:.2f}×"


def _errors(summary: dict[str, Any] | None) -> str:
    if not summary:
        return "–"
    errors = summary["errors"]
    text = ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) if errors else "0"
    if not summary["admissions"]:
        return text
    checks = ", ".join(f"{check} {n}" for check, n in sorted((summary.get("refused_by") or {}).items()))
    return text + f" (+{summary['admissions']} admission{f'; retried over the level: {checks}' if checks else ''})"


def level_table(levels: list[dict[str, Any]]) -> str:
    """Return the after/before/ratio table, one column group per concurrency level."""
    head = ["metric"]
    for level in levels:
        head += [f"{level['callers']} callers: after", "before", "after÷before"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, key, pattern, _ in ROWS:
        cells = [label]
        for level in levels:
            after, before = level.get("after") or {}, level.get("before") or {}
            cells += [_fmt(after.get(key), pattern), _fmt(before.get(key), pattern)]
            plain = key in (
                "cpu",
                "cpu_roles",
                "queue",
                "jobs_measured",
                "engine_busy",
                "queue_wait_mean_s",
                "machine_pace",
                "mean_chars_done",
            )
            cells.append("" if plain else _ratio(after.get(key), before.get(key)))
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["errors by status"]
    for level in levels:
        cells += [_errors(level.get("after")), _errors(level.get("before")), ""]
    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def engine_table(engine: dict[str, Any] | None, levels: list[dict[str, Any]]) -> str:
    """Return the raw engine's throughput per batch size and the served efficiency per level."""
    if not engine:
        return "(engine limit not measured)"
    lines = ["| in-process engine | chars/s | segments/s | audio s/s |", "|---|---|---|---|"]
    for row in engine["rows"]:
        sorted_note = ", length-sorted" if row["batch"] > 1 else ""
        lines.append(
            f"| batch {row['batch']}{sorted_note} | {row['chars_per_s']:.1f} | {row['segments_per_s']:.2f} "
            f"| {row['audio_s_per_s']:.1f} |"
        )
    lines.append("")
    lines.append(f"Engine limit: batch {engine['best_batch']}, {engine['best_chars_per_s']:.1f} chars/s.")
    if "service_batch" in engine:
        # The service runs its default batch cap, as users get it; where the engine says another, the note asks
        # whether the default should change.
        default = WorkerSettings.model_fields["batch_max_size"].default
        other = "" if engine["service_batch"] == default else "; a machine like this one may serve better with that"
        lines.append(
            f"The largest batch within 10% of the engine's best: {engine['service_batch']}. The service ran its "
            f"default TTS_BATCH_MAX_SIZE={default}{other}."
        )
    for level in levels:
        after = level.get("after")
        if after:
            lines.append(
                f"- {level['callers']} callers: served {after['chars_per_s']:.1f} chars/s = "
                f"engine efficiency {after['chars_per_s'] / engine['best_chars_per_s']:.2f}{_why(after, engine)}"
            )
    return "\n".join(lines)


def _why(after: dict[str, Any], engine: dict[str, Any]) -> str:
    """Split the efficiency: audio made by the model hosts per CPU second they got, and the CPU they got."""
    made, best = after.get("audio_made_per_s"), engine.get("best_audio_s_per_s")
    hosts = (after.get("cpu_roles") or {}).get("model hosts")
    replicas = engine.get("replicas", 1)
    if not made or not best:
        return ""
    text = f" (audio made in the window: {made:.1f} of {best:.1f} s/s = {made / best:.2f}"
    if hosts:
        per_core = (made / (hosts / 100)) / (best / replicas)
        text += (
            f"; the model hosts got {hosts:.0f}% of a core of the {100 * replicas}% the limit's engines had, "
            f"and made {per_core:.2f}× the limit's audio per CPU second"
        )
    return text + ")"


def _check(
    found: list[tuple[str, str, bool | None]],
    name: str,
    value: float | None,
    limit: float | None,
    *,
    at_least: bool,
    unit: str = "",
    pattern: str = "{:.3g}",
) -> None:
    """Append (target, measured, met) to ``found``: met is None when either side was not measured."""
    if value is None or limit is None:
        found.append((name, "not measured", None))
        return
    met = value >= limit if at_least else value <= limit
    shown, bound = pattern.format(value), pattern.format(limit)
    found.append((name, f"{shown}{unit} vs {'≥' if at_least else '≤'} {bound}{unit}", met))


def _level(levels: list[dict[str, Any]], callers: int) -> dict[str, Any]:
    return next((lv for lv in levels if lv["callers"] == callers), {})


#: Issue 49: at the defaults, a closed loop of the reference's callers keeps this share of the hand-tuned reference's
#: jobs/s ...
REFERENCE_SHARE = 0.95
#: ... and at most this share of its listeners hear a gap.
GAP_SHARE = 0.02


def targets(
    levels: list[dict[str, Any]], engine: dict[str, Any] | None, reference: dict[str, Any] | None = None
) -> list[tuple[str, str, bool | None]]:
    """Return (target, measured, met) for each of the issue's targets; met is None when not measurable."""
    found: list[tuple[str, str, bool | None]] = []
    check = functools.partial(_check, found)
    if reference:
        callers = reference["callers"]
        defaults = _level(levels, callers).get("after") or {}
        share = defaults["jobs_per_s"] / reference["jobs_per_s"] if defaults and reference["jobs_per_s"] else None
        check(f"{callers} callers: jobs/s ≥ {REFERENCE_SHARE:g}× the hand-tuned reference", share, REFERENCE_SHARE,
              at_least=True, unit="×")  # fmt: skip
        check(f"{callers} callers: listeners with a gap ≤ {GAP_SHARE:.0%}", defaults.get("stall_share"), GAP_SHARE,
              at_least=False, pattern="{:.1%}")  # fmt: skip

    l50, l10, l1 = _level(levels, 50), _level(levels, 10), _level(levels, 1)
    a50, b50 = l50.get("after") or {}, l50.get("before") or {}
    check(
        "50 callers: jobs/s ≥ 3× baseline", a50.get("jobs_per_s"), 3 * b50["jobs_per_s"] if b50 else None, at_least=True
    )
    check(
        "50 callers: p99 first audio ≤ 0.1× baseline p99 latency",
        a50.get("first_audio_p99"),
        0.1 * b50["latency_p99"] if b50.get("latency_p99") else None,
        at_least=False,
        unit=" s",
    )
    efficiency = a50["chars_per_s"] / engine["best_chars_per_s"] if a50 and engine else None
    check("50 callers: engine efficiency ≥ 0.8", efficiency, 0.8, at_least=True)
    if a50:
        errors = sum(a50["errors"].values())
        found.append(("50 callers: zero errors (admission answers aside)", f"{errors} errors", errors == 0))
    else:
        found.append(("50 callers: zero errors (admission answers aside)", "not measured", None))
    a10 = l10.get("after") or {}
    no_stall = 1 - a10["stall_share"] if a10.get("stall_share") is not None else None
    check("10 callers: ≥ 99% of jobs without a stall", no_stall, 0.99, at_least=True)
    a1, b1 = l1.get("after") or {}, l1.get("before") or {}
    check(
        "1 caller: p99 to done ≤ 1.3× baseline",
        a1.get("latency_p99"),
        1.3 * b1["latency_p99"] if b1.get("latency_p99") else None,
        at_least=False,
        unit=" s",
    )
    return found


def real_size_targets(
    levels: list[dict[str, Any]], engine: dict[str, Any] | None, batching_off: dict[str, Any] | None
) -> list[tuple[str, str, bool | None]]:
    """Return (target, measured, met) for issue 16's real-size CPU targets."""
    found: list[tuple[str, str, bool | None]] = []
    check = functools.partial(_check, found)

    on16 = _level(levels, 16).get("after") or {}
    off = (batching_off or {}).get("jobs_per_s")
    gain = on16["jobs_per_s"] / off if on16 and off else None
    check("16 callers: jobs/s with batching ÷ without ≥ 5×", gain, 5.0, at_least=True, unit="×")
    a50 = _level(levels, 50).get("after") or {}
    efficiency = a50["chars_per_s"] / engine["best_chars_per_s"] if a50 and engine else None
    check("50 callers: engine efficiency (served ÷ in-process best) ≥ 0.85", efficiency, 0.85, at_least=True)
    a1, b1 = _level(levels, 1).get("after") or {}, _level(levels, 1).get("before") or {}
    check(
        "1 caller: p99 to done ≤ 1.3× baseline",
        a1.get("latency_p99"),
        1.3 * b1["latency_p99"] if b1.get("latency_p99") else None,
        at_least=False,
        unit=" s",
    )
    a10 = _level(levels, 10).get("after") or {}
    alone = a1.get("first_audio_p50")
    check(
        "10 callers: p99 first audio ≤ 2× a first segment made alone (1 caller's p50 first audio)",
        a10.get("first_audio_p99"),
        2 * alone if alone else None,
        at_least=False,
        unit=" s",
    )
    return found


def reference_note(at_defaults: dict[str, Any] | None, reference: dict[str, Any] | None) -> list[str]:
    """Return the line comparing the level at the defaults with the hand-tuned reference's run."""
    if not reference:
        return []
    changed = ", ".join(f"{k}={v}" for k, v in reference["changes"].items())
    line = (
        f"Hand-tuned reference ({changed}: how the benchmarks ran before they ran the defaults), "
        f"{reference['callers']} callers: {reference['jobs_per_s']:.2f} jobs/s, p50 / p99 first audio "
        f"{_fmt(reference.get('first_audio_p50'), '{:.2f}')} / {_fmt(reference.get('first_audio_p99'), '{:.2f}')} s, "
        f"jobs with a playback stall {_fmt(reference.get('stall_share'), '{:.1%}')}"
    )
    if at_defaults:
        line += (
            f"; at the defaults: {at_defaults['jobs_per_s']:.2f} jobs/s "
            f"({_ratio(at_defaults['jobs_per_s'], reference['jobs_per_s'])}), stalls "
            f"{_fmt(at_defaults.get('stall_share'), '{:.1%}')}"
        )
    return ["", line + "."]


def batching_off_note(on: dict[str, Any] | None, off: dict[str, Any] | None) -> list[str]:
    """Return the line comparing the level run with batching off against the same level with it on."""
    if not off:
        return []
    line = (
        f"Batching off (TTS_BATCH_MAX_SIZE=1), {off['callers']} callers: {off['jobs_per_s']:.3f} jobs/s, "
        f"{off['chars_per_s']:.2f} chars/s, p50 first audio {_fmt(off.get('first_audio_p50'), '{:.1f}')} s"
    )
    if on:
        line += (
            f"; with batching on: {on['jobs_per_s']:.3f} jobs/s, {on['chars_per_s']:.2f} chars/s "
            f"(gain {_ratio(on['jobs_per_s'], off['jobs_per_s'])} in jobs/s)"
        )
    return ["", line + "."]


def targets_table(rows: list[tuple[str, str, bool | None]]) -> str:
    """Return the targets as a markdown table."""
    marks = {True: "met", False: "NOT met", None: "n/a"}
    lines = ["| target | measured | |", "|---|---|---|"]
    lines += [f"| {name} | {measured} | {marks[met]} |" for name, measured, met in rows]
    return "\n".join(lines)


#: Measuring windows shorter than this make a smoke test, not a verdict.
FULL_WINDOW_S = 20.0
#: Above this share of the CPUs used by processes not ours, the results carry a warning.
CONTENDED_PCT = 10.0


def cache_note(cache_line: dict[str, Any] | None) -> list[str]:
    """Return the line on the cache-on level, if one ran."""
    if not cache_line:
        return []
    hit = cache_line["cached_segments"] / max(1, cache_line["segments_total"])
    return [
        "",
        f"Cache on (10 callers, one seed, {cache_line['window_s']:g}s): "
        f"{cache_line['jobs_per_s']:.2f} jobs/s, p50 first audio {cache_line['first_audio_p50']:.2f} s, "
        f"{hit:.0%} of segments from the cache.",
    ]


def contention_note(levels: list[dict[str, Any]]) -> list[str]:
    """Return a warning when processes not ours took a noticeable share of the CPUs in a measured window."""
    others = [
        side["cpu"].get("others_pct", 0.0) for lv in levels for side in (lv.get("after"), lv.get("before")) if side
    ]
    if not others or max(others) <= CONTENDED_PCT:
        return []
    return [
        "",
        f"WARNING: other processes used up to {max(others):.0f}% of the CPUs during the measured windows "
        "(row 'CPU busy'); expect noisier, possibly lower numbers than a quiet machine gives.",
    ]


def short_run_note(levels: list[dict[str, Any]], window_s: float) -> list[str]:
    """Return a reminder that a short run is a smoke test, when it was one."""
    if window_s >= FULL_WINDOW_S:
        return []
    fewest = min((side["jobs_measured"] for lv in levels for side in lv.values() if isinstance(side, dict)), default=0)
    return [
        "",
        f"Short run ({window_s:g}s per level, as few as {fewest} jobs in a level): a smoke test; "
        "judge the targets on a full run.",
    ]


def document(
    title: str,
    levels: list[dict[str, Any]],
    engine: dict[str, Any] | None,
    cache_line: dict[str, Any] | None,
    rows: list[tuple[str, str, bool | None]],
    *,
    window_s: float,
    footer: str,
    batching_off: dict[str, Any] | None = None,
    reference: dict[str, Any] | None = None,
) -> str:
    """Return the whole headline markdown: the tables, the notes that apply, and ``footer``."""
    parts = [
        f"## Headline benchmark: {title}",
        "",
        level_table(levels),
        "",
        engine_table(engine, levels),
        "",
        targets_table(rows),
    ]
    on = _level(levels, batching_off["callers"]).get("after") if batching_off else None
    parts += batching_off_note(on, batching_off)
    at_defaults = _level(levels, reference["callers"]).get("after") if reference else None
    parts += reference_note(at_defaults, reference)
    parts += cache_note(cache_line) + contention_note(levels) + short_run_note(levels, window_s)
    parts += ["", footer]
    return "\n".join(parts)
