"""Time from submit to segment 0's bytes for a one-sentence and a twenty-sentence text, per model.

    python -m bench.first_segment

Uncached jobs (a fresh seed each) on the tiny ChatTTS and on espeak, one at a time,
alternating the two texts; medians of several runs.
"""

from __future__ import annotations

import statistics

from bench.http_stack import first_segment_latency, running_stack
from bench.report import write_result

RUNS = 5
ONE = {"espeak-en": "The morning train was late again.", "chattts-tiny": "今天早上的火车又晚点了。"}
TWENTY = {
    "espeak-en": " ".join(f"Sentence number {i} tells a little more of the story." for i in range(20)),
    "chattts-tiny": "".join(f"这是故事的第{i}句话，它讲了一点新的内容。" for i in range(20)),
}


def main() -> None:
    """Measure and print the table."""
    rows = ["| model | text | segments | median s | min s | max s |", "|---|---|---|---|---|---|"]
    with running_stack("first-segment", TTS_ADMISSION_REALTIME_WAIT_S="3600") as stack:
        for model in ("espeak-en", "chattts-tiny"):
            samples: dict[str, list[float]] = {"one sentence": [], "twenty sentences": []}
            segments: dict[str, int] = {}
            for run in range(RUNS):
                for label, text in (("one sentence", ONE[model]), ("twenty sentences", TWENTY[model])):
                    body = {"text": text, "model": model, "seed": 1000 + run, "cache": False}
                    elapsed, job = first_segment_latency(stack, body)
                    samples[label].append(elapsed)
                    segments[label] = job["segments_total"]
                    stack.wait_idle()
            for label, values in samples.items():
                rows.append(
                    f"| {model} | {label} | {segments[label]} | {statistics.median(values):.3f} | "
                    f"{min(values):.3f} | {max(values):.3f} |"
                )
    table = "## Submit → segment 0 bytes (one job at a time, uncached)\n\n" + "\n".join(rows) + "\n"
    write_result("first-segment", table)
    print(table)


if __name__ == "__main__":
    main()
