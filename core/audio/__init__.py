"""Audio: formats clients ask for (formats), the store's packed segments (packed), growing streams (stream)."""

from __future__ import annotations

from core.audio.formats import MEDIA_TYPES, encode, media_type, mp3_frames, pcm16_duration, resample, to_pcm16
from core.audio.packed import STORE_CODECS, PackedAudio
from core.audio.stream import ByteSink, OpusStream, StreamEncoder, wav_header

__all__ = [
    "MEDIA_TYPES",
    "STORE_CODECS",
    "ByteSink",
    "OpusStream",
    "PackedAudio",
    "StreamEncoder",
    "encode",
    "media_type",
    "mp3_frames",
    "pcm16_duration",
    "resample",
    "to_pcm16",
    "wav_header",
]
