"""A minimal ctypes binding to the libespeak-ng shipped in the espeakng-loader wheel.

libespeak-ng is one global, non-reentrant synthesiser per process: its voice,
rate and output callback are process-wide state. So this module initialises the
library at most once per process (``shared_library``) and serialises every call
behind one lock. Initialise it in the process that synthesises, after any fork.
State also carries over between utterances, so repeating a call gives audio of
almost the same length (within 1%) but not bit-identical samples; a fresh
process replaying the same sequence of calls does reproduce them exactly.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import espeakng_loader
import numpy as np
import numpy.typing as npt

from workers.engines.errors import EngineLoadError, SynthesisError

# Values from espeak-ng's speak_lib.h.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_PARAM_RATE = 1
_EE_OK = 0
_RAND_SEED = 1

#: The speaking rates, in words per minute, that espeak-ng accepts.
MIN_RATE_WPM = 80
MAX_RATE_WPM = 450

# int callback(short *wav, int numsamples, espeak_EVENT *events); return 0 to continue.
_SynthCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class EspeakLibrary:
    """Drive the process's one libespeak-ng synthesiser; get it from ``shared_library``."""

    def __init__(self, library_path: str, data_path: str) -> None:
        if not Path(data_path, "phontab").is_file():
            # Fail with a clear message rather than espeak-ng's own, on stderr.
            raise EngineLoadError(f"espeak-ng data not found in {data_path}")
        try:
            self._lib = ctypes.CDLL(library_path)
        except OSError as e:
            raise EngineLoadError(f"cannot load {library_path}: {e}") from e
        self._declare_signatures()
        self._lock = threading.Lock()
        self._chunks: list[bytes] = []
        # ctypes frees a callback's trampoline with its Python object: keep it alive.
        self._callback = _SynthCallback(self._collect)
        # Without DONT_EXIT, espeak_Initialize calls exit(1) on a data error.
        rate = self._lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path.encode(), _INITIALIZE_DONT_EXIT)
        if rate <= 0:
            raise EngineLoadError(f"espeak_Initialize failed with {rate}")
        self.sample_rate: int = rate
        self._lib.espeak_SetSynthCallback(self._callback)

    def has_voice(self, name: str) -> bool:
        """Return whether espeak-ng can select the voice ``name``, e.g. ``cmn+f3``."""
        with self._lock:
            return bool(self._lib.espeak_SetVoiceByName(name.encode()) == _EE_OK)

    def synthesize(self, text: str, *, voice: str, rate_wpm: int) -> npt.NDArray[np.int16]:
        """Return the int16 samples of ``text`` spoken by ``voice`` at ``rate_wpm``."""
        with self._lock:
            self._check("espeak_SetVoiceByName", self._lib.espeak_SetVoiceByName(voice.encode()))
            self._check("espeak_SetParameter", self._lib.espeak_SetParameter(_PARAM_RATE, rate_wpm, 0))
            # Reseed so a repeated call gets the same breath noise. Pitch-flutter phase
            # (a C static) still carries over between utterances and cannot be reset.
            self._check("espeak_ng_SetRandSeed", self._lib.espeak_ng_SetRandSeed(_RAND_SEED))
            self._chunks = []
            data = text.encode("utf-8")
            status = self._lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
            self._check("espeak_Synth", status)
            self._check("espeak_Synchronize", self._lib.espeak_Synchronize())
            chunks, self._chunks = self._chunks, []
        return np.frombuffer(b"".join(chunks), dtype=np.int16)

    def _collect(self, wav: ctypes._Pointer[ctypes.c_short], count: int, _events: int | None) -> int:
        """Keep one chunk of samples that the synthesiser hands back."""
        if wav and count > 0:
            self._chunks.append(ctypes.string_at(wav, count * ctypes.sizeof(ctypes.c_short)))
        return 0

    def _check(self, function: str, status: int) -> None:
        """Raise SynthesisError when a library call did not return EE_OK."""
        if status != _EE_OK:
            raise SynthesisError(f"{function} failed with espeak error {status}")

    def _declare_signatures(self) -> None:
        """Give every function we call its C signature so ctypes converts arguments."""
        lib, c = self._lib, ctypes
        lib.espeak_Initialize.argtypes = [c.c_int, c.c_int, c.c_char_p, c.c_int]
        lib.espeak_Initialize.restype = c.c_int
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByName.argtypes = [c.c_char_p]
        lib.espeak_SetVoiceByName.restype = c.c_int
        lib.espeak_SetParameter.argtypes = [c.c_int, c.c_int, c.c_int]
        lib.espeak_SetParameter.restype = c.c_int
        lib.espeak_Synth.argtypes = [
            c.c_char_p,
            c.c_size_t,
            c.c_uint,
            c.c_int,
            c.c_uint,
            c.c_uint,
            c.POINTER(c.c_uint),
            c.c_void_p,
        ]
        lib.espeak_Synth.restype = c.c_int
        lib.espeak_ng_SetRandSeed.argtypes = [c.c_long]
        lib.espeak_ng_SetRandSeed.restype = c.c_int
        lib.espeak_Synchronize.argtypes = []
        lib.espeak_Synchronize.restype = c.c_int


# The library itself is process-global, so its one binding is too.
_shared_lock = threading.Lock()
_shared: EspeakLibrary | None = None


def shared_library() -> EspeakLibrary:
    """Return the process's libespeak-ng binding, initialising it on first use."""
    global _shared  # noqa: PLW0603  (libespeak-ng is one engine per process; so is its binding)
    with _shared_lock:
        if _shared is None:
            _shared = EspeakLibrary(espeakng_loader.get_library_path(), espeakng_loader.get_data_path())
        return _shared
