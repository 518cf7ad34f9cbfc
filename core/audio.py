"""Audio conversion: float waveforms to 16-bit PCM, and PCM to the formats clients ask for."""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

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
_SOUNDFILE_FORMATS: dict[str, tuple[str, str]] = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "VORBIS"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
}
# Opus only takes these rates; other audio is resampled to the next one up.
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)

#: How segment audio may be kept in Redis (each value starts with its codec's tag): FLAC is lossless; Vorbis is
#: lossy and under half of FLAC's size. Tags are chosen so that a reader tells them from the raw PCM that
#: values held before codecs existed (a live job across an upgrade) and decodes those too.
STORE_CODECS: dict[str, bytes] = {"flac": b"FfLaC", "vorbis": b"VOggS", "pcm": b"P\x00PCM"}
# libsndfile's FLAC levels run 0..1 (fastest..smallest); 1 is still ~500x real time on one core.
_STORE_OPTIONS: dict[str, tuple[str, str, float]] = {"flac": ("FLAC", "PCM_16", 1.0), "vorbis": ("OGG", "VORBIS", 0.4)}


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
    if fmt == "opus" and sample_rate not in _OPUS_RATES:
        target = next(r for r in _OPUS_RATES if r >= sample_rate)
        samples = resample(samples, sample_rate, target)
        sample_rate = target
    buffer = io.BytesIO()
    # Constant-bitrate MP3: pieces then concatenate into a stream whose length decoders can trust.
    extra = {"bitrate_mode": "CONSTANT", "compression_level": 0.5} if fmt == "mp3" else {}
    sf.write(buffer, samples, sample_rate, format=container, subtype=subtype, **extra)
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


def _mp3_frame_length(header: bytes) -> int:
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
    length = _mp3_frame_length(data[:4])
    first = data[:length]
    return data[length:] if b"Xing" in first or b"Info" in first else data


class OpusStream:
    """Encode a growing 16-bit stream as one Ogg Opus file, handing out bytes as they are made."""

    def __init__(self, sample_rate: int) -> None:
        self.source_rate = sample_rate
        self.rate = next(r for r in _OPUS_RATES if r >= sample_rate)
        # A sink that keeps only the bytes not yet handed out: a BytesIO would keep the whole file.
        self._sink = ByteSink()
        self._file = sf.SoundFile(self._sink, "w", samplerate=self.rate, channels=1, format="OGG", subtype="OPUS")

    def _take(self) -> bytes:
        return self._sink.take()

    def write(self, pcm: bytes) -> bytes:
        """Add PCM; return the encoded bytes that are final so far."""
        samples = np.frombuffer(pcm, dtype="<i2")
        if self.rate != self.source_rate:
            samples = resample(samples, self.source_rate, self.rate)
        self._file.write(samples)
        return self._take()

    def close(self) -> bytes:
        """Finish the stream; return its last bytes."""
        self._file.close()
        return self._take()


class ByteSink:
    """A write-only file for libsndfile that hands out its bytes as they are written, keeping none it handed out.

    An encoder that seeks back to patch what it wrote (a header's lengths at close) cannot reach bytes
    already handed out: such writes are dropped, so a format whose header matters is patched up front
    (see ``StreamEncoder``).
    """

    def __init__(self) -> None:
        self._pending = bytearray()
        self._sent = 0  # bytes handed out; the pending ones start here
        self._pos = 0

    def write(self, data: bytes) -> int:
        """Write at the current position; bytes already handed out are not changed."""
        end = self._pos + len(data)
        start = max(self._pos, self._sent)
        if end > start:
            offset = start - self._sent
            if offset > len(self._pending):
                self._pending.extend(bytes(offset - len(self._pending)))
            self._pending[offset : offset + end - start] = memoryview(data)[start - self._pos :]
        self._pos = end
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move the write position (libsndfile seeks to patch headers)."""
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._sent + len(self._pending)}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        """Return the write position."""
        return self._pos

    def read(self, size: int = -1) -> bytes:
        """Read nothing: the sink only writes."""
        return b""

    def take(self) -> bytes:
        """Return the bytes written since the last call, and forget them."""
        data = bytes(self._pending)
        self._sent += len(data)
        self._pending.clear()
        return data


def wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    """Return a 16-bit mono WAV header for ``data_bytes`` of PCM; None gives the maximal sizes of a growing stream."""
    if data_bytes is not None and data_bytes > 0xFFFFFFFF - 36:
        data_bytes = None  # past 4 GiB a WAV header cannot state the size: say "unknown", as a stream does
    data_size = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff_size = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff_size)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data_size)
    )


def _mp3_first_frame_whole(head: bytes, length: int) -> bool:
    if len(head) < 4:
        return False
    if head[0] != 0xFF or (head[1] & 0xE0) != 0xE0:
        return True  # no frame to drop
    return length >= _mp3_frame_length(head)


# A FLAC stream starts "fLaC", a block header and STREAMINFO, whose 36-bit total sample count ends at byte 26.
_FLAC_HEAD = 42


def _flac_with_total(head: bytes, total_samples: int) -> bytes:
    patched = bytearray(head)
    patched[21] = (patched[21] & 0xF0) | ((total_samples >> 32) & 0x0F)
    patched[22:26] = (total_samples & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes(patched)


class StreamEncoder:
    """Encode 16-bit mono PCM, piece by piece, into one file of ``fmt``, handing out bytes as they are final.

    Memory stays that of one piece whatever the file's length. WAV and FLAC need ``total_samples`` up front:
    their headers state the length, and bytes handed out cannot be patched at the end (FLAC's frame sizes and
    checksum stay "unknown", which its format allows). MP3 loses its leading Info frame, which would state a
    length of zero frames; Ogg streams (Vorbis, Opus) need no patching.
    """

    def __init__(self, fmt: str, sample_rate: int, *, total_samples: int | None = None) -> None:
        if fmt == "flac" and total_samples is None:
            raise ValueError("a FLAC stream needs its total length up front")
        self.fmt = fmt
        self.source_rate = sample_rate
        self.rate = next(r for r in _OPUS_RATES if r >= sample_rate) if fmt == "opus" else sample_rate
        self.total_samples = total_samples
        data_bytes = None if total_samples is None else total_samples * 2
        self._head = wav_header(sample_rate, data_bytes) if fmt == "wav" else b""  # what goes before the first PCM
        self._held = bytearray()  # the start of the file until it can be patched
        self._patched = fmt in ("pcm", "wav")
        self._sink: ByteSink | None = None
        self._file: sf.SoundFile | None = None
        if fmt not in ("pcm", "wav"):
            container, subtype = _SOUNDFILE_FORMATS[fmt]
            extra = {"bitrate_mode": "CONSTANT", "compression_level": 0.5} if fmt == "mp3" else {}
            self._sink = ByteSink()
            self._file = sf.SoundFile(
                self._sink, "w", samplerate=self.rate, channels=1, format=container, subtype=subtype, **extra
            )

    def write(self, pcm: bytes) -> bytes:
        """Add PCM; return the encoded bytes that are final so far (often empty for a codec that buffers)."""
        if self._file is None:
            head, self._head = self._head, b""
            return head + pcm
        samples = np.frombuffer(pcm, dtype="<i2")
        if self.rate != self.source_rate:
            samples = resample(samples, self.source_rate, self.rate)
        self._file.write(samples)
        return self._hand_out(final=False)

    def close(self) -> bytes:
        """Finish the file; return its last bytes."""
        if self._file is None:
            head, self._head = self._head, b""
            return head
        self._file.close()
        return self._hand_out(final=True)

    def _hand_out(self, *, final: bool) -> bytes:
        assert self._sink is not None
        data = self._sink.take()
        if self._patched:
            return data
        self._held += data
        if self.fmt == "flac" and (len(self._held) >= _FLAC_HEAD or final):
            assert self.total_samples is not None
            data, self._patched = _flac_with_total(bytes(self._held), self.total_samples), True
        elif self.fmt == "mp3" and (final or _mp3_first_frame_whole(bytes(self._held[:4]), len(self._held))):
            data, self._patched = mp3_frames(bytes(self._held)), True
        elif self.fmt in ("ogg", "opus") or final:
            data, self._patched = bytes(self._held), True
        else:
            return b""
        self._held.clear()
        return data
