"""Segment audio as the job store and the sentence cache keep it: a codec tag, then the encoded audio."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import soundfile as sf

#: How segment audio may be kept in Redis (each value starts with its codec's tag): FLAC is lossless; Vorbis is
#: lossy and under half of FLAC's size. Tags are chosen so that a reader tells them from the raw PCM that
#: values held before codecs existed (a live job across an upgrade) and decodes those too.
STORE_CODECS: dict[str, bytes] = {"flac": b"FfLaC", "vorbis": b"VOggS", "pcm": b"P\x00PCM"}
# libsndfile's FLAC levels run 0..1 (fastest..smallest), libFLAC's 0..8 in eighths: 0.625 is libFLAC's default 5.
# Its highest level saves only a little more, for about twice the encoding CPU on the worker's path of every segment
# (python -m bench.store_codecs measures both).
_STORE_OPTIONS: dict[str, tuple[str, str, float]] = {
    "flac": ("FLAC", "PCM_16", 0.625),
    "vorbis": ("OGG", "VORBIS", 0.4),
}


@dataclass(frozen=True)
class PackedAudio:
    """Segment audio as the job store and the sentence cache keep it: encoded once, by the worker that made it.

    ``data`` is a one-byte codec tag and the encoded audio, so a reader needs no other field to decode it.
    """

    data: bytes

    @classmethod
    def pack(cls, pcm: bytes, sample_rate: int, codec: str = "flac") -> PackedAudio:
        """Encode mono 16-bit PCM with a store codec (see ``STORE_CODECS``)."""
        if codec not in STORE_CODECS:
            raise ValueError(f"unknown store codec {codec!r}; one of {', '.join(STORE_CODECS)}")
        if codec == "pcm" or not pcm:
            return cls(STORE_CODECS["pcm"] + pcm)
        container, subtype, level = _STORE_OPTIONS[codec]
        buffer = io.BytesIO()
        samples = np.frombuffer(pcm, dtype="<i2")
        sf.write(buffer, samples, sample_rate, format=container, subtype=subtype, compression_level=level)
        # One letter, then the file's own magic (fLaC, OggS): raw PCM from before tags existed is told apart.
        return cls((b"F" if codec == "flac" else b"V") + buffer.getvalue())

    @property
    def codec(self) -> str:
        """Return the codec the audio is kept in ("raw" for an untagged value written before codecs existed)."""
        return next((name for name, tag in STORE_CODECS.items() if self.data.startswith(tag)), "raw")

    def samples(self) -> int:
        """Return how many samples the audio holds, from FLAC's header when it says (no decoding), else decoded."""
        codec = self.codec
        if codec in ("raw", "pcm"):
            return len(self.pcm()) // 2
        if codec == "flac" and self.data[5] & 0x7F == 0:  # the first metadata block is STREAMINFO
            # fLaC, a 4-byte block header, then STREAMINFO: 10 bytes of block and frame sizes, then 20 bits of
            # rate, 3 of channels, 5 of bits per sample and 36 of total samples (0 when the writer did not know).
            total = int.from_bytes(self.data[1 + 4 + 4 + 10 : 1 + 4 + 4 + 18], "big") & ((1 << 36) - 1)
            if total:
                return total
        return len(self.pcm()) // 2

    def pcm(self) -> bytes:
        """Decode to mono 16-bit PCM."""
        codec = self.codec
        if codec == "raw":
            return self.data
        if codec == "pcm":
            return self.data[len(STORE_CODECS["pcm"]) :]
        samples, _ = sf.read(io.BytesIO(self.data[1:]), dtype="int16")
        return np.asarray(samples, dtype="<i2").tobytes()
