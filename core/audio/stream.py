"""Encoders of growing audio: PCM in, piece by piece, bytes of one file out as soon as they are final."""

from __future__ import annotations

import io
import struct

import numpy as np
import soundfile as sf

from core.audio.formats import (
    SOUNDFILE_FORMATS,
    mp3_first_frame_whole,
    mp3_frames,
    opus_rate,
    resample,
    soundfile_options,
)


class OpusStream:
    """Encode a growing 16-bit stream as one Ogg Opus file, handing out bytes as they are made."""

    def __init__(self, sample_rate: int) -> None:
        self.source_rate = sample_rate
        self.rate = opus_rate(sample_rate)
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
        self.rate = opus_rate(sample_rate) if fmt == "opus" else sample_rate
        self.total_samples = total_samples
        data_bytes = None if total_samples is None else total_samples * 2
        self._head = wav_header(sample_rate, data_bytes) if fmt == "wav" else b""  # what goes before the first PCM
        self._held = bytearray()  # the start of the file until it can be patched
        self._patched = fmt in ("pcm", "wav")
        self._sink: ByteSink | None = None
        self._file: sf.SoundFile | None = None
        if fmt not in ("pcm", "wav"):
            container, subtype = SOUNDFILE_FORMATS[fmt]
            self._sink = ByteSink()
            self._file = sf.SoundFile(
                self._sink,
                "w",
                samplerate=self.rate,
                channels=1,
                format=container,
                subtype=subtype,
                **soundfile_options(fmt),
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
        elif self.fmt == "mp3" and (final or mp3_first_frame_whole(bytes(self._held[:4]), len(self._held))):
            data, self._patched = mp3_frames(bytes(self._held)), True
        elif self.fmt in ("ogg", "opus") or final:
            data, self._patched = bytes(self._held), True
        else:
            return b""
        self._held.clear()
        return data
