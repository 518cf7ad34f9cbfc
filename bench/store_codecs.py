"""What a second of stored audio costs in Redis, per store codec, on real engine output.

    python -m bench.store_codecs [--with-tiny-chattts]

For each engine (eSpeak NG Mandarin and English; optionally the tiny random-weight ChatTTS, whose noise-like
output is no guide to real speech), it synthesises a few sentences, packs every segment as the job store does
(core.audio.PackedAudio) with each codec, and prints KB per audio second, the share of raw 16-bit PCM, and the
CPU time to encode (worker, once per segment) and decode (API, per segment served) per audio second.
Results go to bench/results/store_codecs.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from core.audio import STORE_CODECS, PackedAudio, to_pcm16
from core.registry import load_registry
from core.settings import Settings
from workers.engines.base import Engine, SynthesisRequest
from workers.engines.factory import build_engine

RESULTS = Path(__file__).resolve().parent / "results" / "store_codecs.md"
TEXTS = {
    "zh": ["今天的天气很好，我们去公园散步吧。", "请稍等，马上为您转接人工服务。",
           "列车即将进站，请站稳扶好，注意安全。", "会议改到下午三点，请大家准时参加。",
           "谢谢你的耐心等待，祝你生活愉快。"],
    "en": ["The quick brown fox jumps over the lazy dog.", "Please hold the line while we connect your call.",
           "The next train to the city centre leaves in five minutes.", "Thank you for waiting; your order is ready.",
           "Every finished segment is written the moment it exists."],
}  # fmt: skip


def measure(engine: Engine, texts: list[str]) -> list[tuple[str, float, float, float, float]]:
    """Return (codec, KB per audio s, share of raw PCM, encode ms per audio s, decode ms per audio s)."""
    engine.load()
    waves = engine.synthesize([SynthesisRequest(text=t) for t in texts])
    rate = engine.sample_rate
    pcms = [to_pcm16(w) for w in waves]
    seconds = sum(len(p) / 2 / rate for p in pcms)
    rows = []
    for codec in STORE_CODECS:
        encode_s, decode_s, stored = [], [], 0
        for _ in range(3):
            started = time.perf_counter()
            packed = [PackedAudio.pack(p, rate, codec) for p in pcms]
            encode_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            for item in packed:
                item.pcm()
            decode_s.append(time.perf_counter() - started)
            stored = sum(len(item.data) for item in packed)
        raw = sum(len(p) for p in pcms)
        rows.append((codec, stored / seconds / 1024, stored / raw, 1000 * statistics.median(encode_s) / seconds,
                     1000 * statistics.median(decode_s) / seconds))  # fmt: skip
    engine.unload()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--with-tiny-chattts", action="store_true", help="also the tiny random-weight ChatTTS")
    args = parser.parse_args()
    settings = Settings()
    registry = load_registry(settings)
    models = ["espeak-cmn", "espeak-en"] + (["chattts-tiny"] if args.with_tiny_chattts else [])
    lines = [
        "| model | codec | KB per audio second | share of raw PCM | encode ms per audio s | decode ms per audio s |",
        "|---|---|---|---|---|---|",
    ]
    for name in models:
        spec = registry.get(name)
        for codec, kb, share, enc, dec in measure(build_engine(spec, device="cpu"), TEXTS[spec.language]):
            lines.append(f"| {name} | {codec} | {kb:.1f} | {share:.0%} | {enc:.2f} | {dec:.2f} |")
    print("\n".join(lines))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("# Stored audio per codec (`python -m bench.store_codecs`)\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
