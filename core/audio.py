"""Audio conversion: float waveforms to 16-bit PCM, and PCM to the formats clients ask for."""

from __future__ import annotations

import io

import numpy as np
import numpy.typing as npt
import soundfile as sf

#: Formats a job may ask for, with their HTTP media types.
MEDIA_TYPES: dict[str, str] = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "ogg": "audio/ogg",
    "mp3": "audio/mpeg",
    "pcm": "audio/L16",
}

# soundfile's (format, subtype) for each container; pcm is raw and needs no container.
_SOUNDFILE_FORMATS: dict[str, tuple[str, str]] = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "VORBIS"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
}


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
    container, subtype = _SOUNDFILE_FORMATS[fmt]
    samples = np.frombuffer(pcm, dtype="<i2")
    buffer = io.BytesIO()
    sf.write(buffer, samples, sample_rate, format=container, subtype=subtype)
    return buffer.getvalue()
