"""Write the raw 16-bit PCM a ``book`` run collects as a sound file.

WAV and raw PCM need nothing beyond the standard library. FLAC, Ogg Vorbis, MP3 and Opus are encoded with
soundfile (libsndfile), an optional extra of the client: ``pip install 'tts-queue[audio]'``.
"""

from __future__ import annotations

import io
import wave
from pathlib import Path
from typing import Any

#: Output formats by file suffix; ``pcm`` is raw 16-bit little-endian mono.
SUFFIX_FORMATS = {".wav": "wav", ".flac": "flac", ".ogg": "ogg", ".mp3": "mp3", ".opus": "opus", ".pcm": "pcm"}
#: Formats written without soundfile.
BUILTIN_FORMATS = frozenset({"wav", "pcm"})
# soundfile's (format, subtype) for each container.
_SOUNDFILE_FORMATS: dict[str, tuple[str, str]] = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "VORBIS"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
}
# Opus only takes these rates; other audio is resampled to the next one up.
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


class AudioSupportMissing(Exception):
    """Raised when a format needs soundfile and it is not installed."""

    def __init__(self, fmt: str) -> None:
        super().__init__(
            f"writing {fmt} files needs the soundfile package: pip install 'tts-queue[audio]' "
            f"(or pip install soundfile), or write a .wav or .pcm file"
        )
        self.fmt = fmt


def check_supported(fmt: str) -> None:
    """Raise ``AudioSupportMissing`` now, before any work, if ``fmt`` cannot be written here."""
    if fmt not in BUILTIN_FORMATS:
        _soundfile(fmt)


def _soundfile(fmt: str) -> Any:
    try:
        import soundfile
    except (ImportError, OSError) as e:  # OSError: the package is there but libsndfile is not
        raise AudioSupportMissing(fmt) from e
    return soundfile


def encode(pcm: bytes, sample_rate: int, fmt: str) -> bytes:
    """Encode mono 16-bit little-endian PCM as ``fmt`` (one of ``SUFFIX_FORMATS``' values)."""
    if fmt == "pcm":
        return pcm
    if fmt == "wav":
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(sample_rate)
            out.writeframes(pcm)
        return buffer.getvalue()
    sf = _soundfile(fmt)
    import numpy as np  # a dependency of soundfile

    samples = np.frombuffer(pcm, dtype="<i2")
    if fmt == "opus" and sample_rate not in _OPUS_RATES:
        target = next(r for r in _OPUS_RATES if r >= sample_rate)
        count = round(len(samples) * target / sample_rate)
        positions = np.linspace(0, len(samples) - 1, count) if len(samples) else np.zeros(0)
        samples = np.interp(positions, np.arange(len(samples)), samples).round().astype("<i2")
        sample_rate = target
    container, subtype = _SOUNDFILE_FORMATS[fmt]
    # Constant-bitrate MP3, as the service writes it.
    extra = {"bitrate_mode": "CONSTANT", "compression_level": 0.5} if fmt == "mp3" else {}
    buffer = io.BytesIO()
    sf.write(buffer, samples, sample_rate, format=container, subtype=subtype, **extra)
    return buffer.getvalue()


def output_format(path: Path, given: str | None) -> str:
    """Return the format named by ``--format`` or else by the output file's suffix."""
    if given:
        return given
    fmt = SUFFIX_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise SystemExit(f"error: cannot tell the format of {path}; use one of {sorted(SUFFIX_FORMATS)} or --format")
    return fmt


def write_audio(path: Path, pcm: bytes, sample_rate: int, fmt: str) -> None:
    """Encode mono 16-bit PCM as ``fmt`` into ``path``, atomically (a temporary file, then a rename)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(encode(pcm, sample_rate, fmt))
    temporary.replace(path)
