"""Audio formats: float waveforms to 16-bit PCM, and PCM to the formats clients ask for, in one piece."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import numpy.typing as npt
import soundfile as sf

#: Formats a job may ask for, with their HTTP media types.
MEDIA_TYPES: dict[str, str] = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "ogg": "audio/ogg",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg; codecs=opus",
    "pcm": "audio/L16",
}


# soundfile's (format, subtype) for each container; pcm is raw and needs no container.
SOUNDFILE_FORMATS: dict[str, tuple[str, str]] = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "VORBIS"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
}
# Opus only takes these rates; other audio is resampled to the next one up.
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


def opus_rate(sample_rate: int) -> int:
    """Return the rate Opus encodes audio of ``sample_rate`` at: the next one it takes."""
    return next(r for r in OPUS_RATES if r >= sample_rate)


def soundfile_options(fmt: str) -> dict[str, Any]:
    """Return soundfile's extra encoder options for ``fmt``."""
    # Constant-bitrate MP3: pieces then concatenate into a stream whose length decoders can trust.
    return {"bitrate_mode": "CONSTANT", "compression_level": 0.5} if fmt == "mp3" else {}


def to_pcm16(wave: npt.NDArray[np.floating]) -> bytes:
    """Convert a mono float waveform in [-1, 1] to little-endian 16-bit PCM bytes."""
    clipped = np.clip(np.asarray(wave, dtype=np.float32), -1.0, 1.0)
    return (clipped * 32767.0).round().astype("<i2").tobytes()


def pcm16_duration(pcm: bytes, sample_rate: int) -> float:
    """Return the duration in seconds of mono 16-bit PCM bytes."""
    return len(pcm) / 2 / sample_rate


def media_type(fmt: str, sample_rate: int) -> str:
    """Return the Content-Type for ``fmt``; raw PCM names its rate and channels."""
    if fmt == "pcm":
        return f"audio/L16; rate={sample_rate}; channels=1"
    return MEDIA_TYPES[fmt]


def encode(pcm: bytes, sample_rate: int, fmt: str) -> bytes:
    """Encode mono 16-bit PCM into ``fmt`` (wav, flac, ogg, mp3 or pcm)."""
    if fmt == "pcm":
        return pcm
    container, subtype = SOUNDFILE_FORMATS[fmt]
    samples = np.frombuffer(pcm, dtype="<i2")
    if fmt == "opus" and sample_rate not in OPUS_RATES:
        target = opus_rate(sample_rate)
        samples = resample(samples, sample_rate, target)
        sample_rate = target
    buffer = io.BytesIO()
    sf.write(buffer, samples, sample_rate, format=container, subtype=subtype, **soundfile_options(fmt))
    return buffer.getvalue()


def resample(samples: npt.NDArray[np.int16], rate: int, target: int) -> npt.NDArray[np.int16]:
    """Resample 16-bit audio linearly (good enough for speech bound for a lossy codec)."""
    count = round(len(samples) * target / rate)
    positions = np.linspace(0, len(samples) - 1, count) if len(samples) else np.zeros(0)
    return np.interp(positions, np.arange(len(samples)), samples).round().astype("<i2")


# MPEG audio frame sizes: bitrates (kbit/s) and sample rates by version, for Layer III.
_MP3_BITRATES = {
    "1": (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    "2": (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def mp3_frame_length(header: bytes) -> int:
    """Return the length in bytes of the MPEG Layer III frame whose 4-byte header is ``header``."""
    version_bits = (header[1] >> 3) & 0b11
    bitrate = _MP3_BITRATES["1" if version_bits == 3 else "2"][header[2] >> 4]
    rate = _MP3_RATES[version_bits][(header[2] >> 2) & 0b11]
    padding = (header[2] >> 1) & 1
    per_frame = 144 if version_bits == 3 else 72
    return per_frame * bitrate * 1000 // rate + padding


def mp3_frames(data: bytes) -> bytes:
    """Drop the leading Xing/Info frame of an MP3 so pieces concatenate into one playable stream.

    That frame states the length of its own piece; a decoder that trusts it stops after the first piece.
    """
    if len(data) < 4 or data[0] != 0xFF or (data[1] & 0xE0) != 0xE0:
        return data
    length = mp3_frame_length(data[:4])
    first = data[:length]
    return data[length:] if b"Xing" in first or b"Info" in first else data


def mp3_first_frame_whole(head: bytes, length: int) -> bool:
    """Say whether the first ``length`` bytes of an MP3 starting ``head`` hold its first frame whole."""
    if len(head) < 4:
        return False
    if head[0] != 0xFF or (head[1] & 0xE0) != 0xE0:
        return True  # no frame to drop
    return length >= mp3_frame_length(head)
