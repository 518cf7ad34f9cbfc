"""ChatTTS behind the Engine interface: one model call per batch, each item trimmed to its own length."""

from __future__ import annotations

import functools
import gc
import logging
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.engines import decode
from workers.engines.base import (
    Arrivals,
    Engine,
    Fragment,
    Piece,
    Ready,
    SynthesisRequest,
    Waveform,
    every_one_made,
)
from workers.engines.chattts_assets import descriptor_config, find_weights, read_descriptor, where_weights_go
from workers.engines.chattts_files import check_weights
from workers.engines.chattts_generate import generate, prepare
from workers.engines.chattts_int8 import int8_supported, quantize_linear_layers, quantized_bytes
from workers.engines.chattts_jit import cache_text_jit
from workers.engines.chattts_static import checked_static_step
from workers.engines.errors import EngineLoadError, SynthesisError
from workers.engines.fragments import SAMPLES_PER_TOKEN, FragmentSizes, TokenFragments, Window
from workers.engines.static_cache import StaticCache
from workers.engines.static_step import StaticStep

__all__ = ["ChatTTSEngine", "find_weights", "speed_prompt", "where_weights_go"]

log = logging.getLogger(__name__)

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: The Llama's Linear layers in int8, the rest in fp32 (workers/engines/chattts_int8.py).
INT8 = "int8"
#: The CPU flags (Linux /proc/cpuinfo) of native half-precision matrix multiplies, per dtype.
NATIVE_HALF_FLAGS = {torch.float16: ("avx512_fp16", "amx_fp16"), torch.bfloat16: ("avx512_bf16", "amx_bf16")}


def cpu_multiplies_natively(dtype: torch.dtype, cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Say whether this CPU multiplies ``dtype`` matrices in hardware (False when it cannot tell)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return any(flag in flags for flag in NATIVE_HALF_FLAGS.get(dtype, ()))


MIN_TOKENS = 24


def speed_prompt(speed: float) -> str:
    """Map a speed factor to ChatTTS's prompt: 1.0 is ``[speed_5]``, clamped to ``[speed_0]``..``[speed_9]``."""
    level = min(9, max(0, math.floor(5 * speed + 0.5)))
    return f"[speed_{level}]"


class ChatTTSEngine(Engine):
    """Synthesise batches with ChatTTS so each item sounds as it would alone."""

    sample_rate = 24000

    def __init__(
        self,
        *,
        weights_dir: Path,
        device: str,
        precision: str = "fp32",
        voices: dict[str, dict[str, Any]] | None = None,
        tokens_per_char: float = 6.0,
        max_tokens: int = 2048,
        fixed_token_budget: bool = False,
        half_on_cpu: bool | None = None,
        fragment_context: int = 8,
        fragment_lookahead: int = 8,
        fragment_crossfade: int = 0,
        fragment_first_lookahead: int = 4,
        fragment_lead_s: float = 1.0,
        static_rows: int = 64,
        static_positions: int = 768,
    ) -> None:
        if precision not in PRECISIONS and precision != INT8:
            raise ValueError(f"precision must be one of {[*sorted(PRECISIONS), INT8]}, not {precision!r}")
        for name, voice in (voices or {}).items():
            if not isinstance(voice, dict) or len(voice) != 1 or not voice.keys() <= {"speaker_seed", "spk_emb"}:
                raise ValueError(f"voice {name!r} must be {{'speaker_seed': int}} or {{'spk_emb': str}}")
        self._weights_dir = Path(weights_dir)
        self._device = device
        self._precision = precision
        self._voices = dict(voices or {})
        self._tokens_per_char = tokens_per_char
        self._max_tokens = max_tokens
        self._fixed_budget = fixed_token_budget
        self._half_on_cpu = half_on_cpu  # None: only where the CPU multiplies that type natively
        # What each fragment is decoded with (workers/engines/fragments.py); ``make bench-fragments`` measures it.
        self._window = Window(context=fragment_context, lookahead=fragment_lookahead, crossfade=fragment_crossfade,
                              first_lookahead=fragment_first_lookahead)  # fmt: skip
        self._lead_s = fragment_lead_s
        # The static key/value cache's size (rows × positions), made once when graphs are on (static_step).
        self._static_size = (static_rows, static_positions)
        self._graphs = "auto"
        self._static: StaticStep | None = None
        self._path = "not loaded"
        #: Seconds the load spent on the decode step: the static cache, each graph's capture and probe, the check.
        self.step_prepare_s = 0.0
        self._chat: Any = None
        self._speakers: dict[str, str] = {}

    @property
    def chat(self) -> Any:
        """Return the loaded ChatTTS instance (None before load), for measurements that wrap its methods."""
        return self._chat

    @property
    def llama_dtype(self) -> torch.dtype | None:
        """Return the dtype the loaded Llama runs in (what the precision became on this device), or None."""
        return None if self._chat is None else self._chat.gpt.gpt.dtype

    def load(self) -> None:
        """Load ChatTTS from the weights directory onto the device and cast its Llama to the precision."""
        import ChatTTS

        if self._precision == INT8 and (why := int8_supported(self._device)) is not None:
            raise EngineLoadError(why)
        cache_text_jit()
        # ChatTTS's loader hashes real weights itself; this finds missing, empty and truncated files first.
        availability = check_weights(self._weights_dir, hashes=False)
        if not availability.ok:
            raise EngineLoadError(f"ChatTTS cannot load {self._weights_dir}: {availability.reason}")
        source, root = find_weights(self._weights_dir)
        chat = ChatTTS.Chat(log)
        device = torch.device(self._device)
        if device.type == "cuda" and device.index is not None:  # a host runs on one GPU: its streams, graphs and
            torch.cuda.set_device(device)  # "cuda" tensors go there
        try:
            descriptor = read_descriptor(root)
            if descriptor is None:
                loaded = chat.load(source=source, custom_path=str(self._weights_dir), device=device, compile=False)
            else:
                loaded = _load_random_weights(chat, root, descriptor, device)
        except Exception as e:
            raise EngineLoadError(f"ChatTTS failed to load {root}: {e}; {where_weights_go(self._weights_dir)}") from e
        if not loaded:
            raise EngineLoadError(
                f"ChatTTS could not load the weights in {root} (missing files or SHA-256 mismatch); "
                f"{where_weights_go(self._weights_dir)}"
            )
        chat.gpt.gpt.to(dtype=self._llama_dtype())
        if self._precision == INT8:
            swapped = quantize_linear_layers(chat.gpt.gpt)
            log.info("ChatTTS's Llama runs its %d Linear layers in int8 (dynamic activations)", swapped)
        self._speakers = self._speaker_embeddings(chat)
        started = time.perf_counter()
        self._static, self._path = checked_static_step(
            chat, mode=self._graphs, rows=self._static_size[0], positions=self._static_size[1]
        )
        self.step_prepare_s = time.perf_counter() - started
        self._chat = chat

    def set_graphs(self, mode: str) -> None:
        """Capture the decode step as CUDA graphs: ``auto`` (on a GPU), ``on`` (a CPU runs the static step), ``off``."""
        self._graphs = mode

    @property
    def static_step(self) -> StaticStep | None:
        """Return the static step that serves (None: the growing loop), for measurements of it."""
        return self._static

    @property
    def decode_path(self) -> str:
        """Say how a decode step runs: the growing loop, the static step, or its CUDA graphs (and why)."""
        return self._path

    def _llama_dtype(self) -> torch.dtype:
        dtype = PRECISIONS.get(self._precision, torch.float32)  # int8's layers quantize from fp32
        if dtype is torch.float32 or not self._device.startswith("cpu"):
            return dtype
        native = cpu_multiplies_natively(dtype) if self._half_on_cpu is None else self._half_on_cpu
        if not native:
            # Emulated half-precision matrix products are slower than fp32, and gain far less from batching.
            log.warning("this CPU has no native %s matrix multiply: running ChatTTS's Llama in fp32, which is "
                        "faster here (precision %r applies on GPUs)", self._precision, self._precision)  # fmt: skip
            return torch.float32
        try:
            probe = torch.ones(2, 2, dtype=dtype)
            probe @ probe
        except RuntimeError as e:
            log.warning("%s matmul unsupported on this CPU (%s); running ChatTTS in fp32", self._precision, e)
            return torch.float32
        return dtype

    def _speaker_embeddings(self, chat: Any) -> dict[str, str]:
        from ChatTTS.model import Speaker

        # Sampled on the CPU so a speaker seed gives the same voice on every device.
        speaker = Speaker(chat.config.gpt.hidden_size, chat.config.spk_stat, torch.device("cpu"))
        embeddings = {}
        for name, voice in self._voices.items():
            if "spk_emb" in voice:
                embedding = str(voice["spk_emb"])
                try:
                    size = Speaker._decode(embedding).size
                except Exception as e:
                    raise EngineLoadError(f"voice {name!r} has an unreadable spk_emb: {e}") from e
                if size != speaker.dim:
                    raise EngineLoadError(f"voice {name!r} has a {size}-d spk_emb; this model needs {speaker.dim}")
            else:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(int(voice["speaker_seed"]))
                    embedding = speaker.sample_random()
            embeddings[name] = embedding
        return embeddings

    def token_budget(self, text: str) -> int:
        """Return the most audio tokens (about 21 ms each) a segment of ``text`` may take."""
        return max(MIN_TOKENS, min(self._max_tokens, math.ceil(self._tokens_per_char * len(text))))

    def synthesize(self, batch: list[SynthesisRequest]) -> list[Waveform]:
        """Return exactly one mono float32 waveform per request, in order."""
        return self.synthesize_each(batch, lambda index, wave: None)

    @property
    def takes_arrivals(self) -> bool:
        """Say whether segments can join a running call: on ChatTTS's Llama with its key/value cache (not vLLM's)."""
        return self._chat is not None and decode.supports(self._chat.gpt)

    def synthesize_each(
        self,
        batch: list[SynthesisRequest],
        ready: Ready,
        arrivals: Arrivals | None = None,
        fragment: Fragment | None = None,
    ) -> list[Waveform]:
        """Return one waveform per request, telling ``ready`` each one as its item ends, before the rest go on.

        ``arrivals`` is asked between decode steps for segments to join the call; their waveforms follow the
        batch's, in the order they arrived. ``fragment`` is told each item's fragments as its tokens are made,
        cut on the engine's ``fragment_schedule``; joined, they are the waveform ``ready`` is told.
        """
        chat = self._chat
        if chat is None:
            raise SynthesisError("ChatTTSEngine.synthesize called before load")
        if not batch:
            return []
        waves: list[Waveform | None] = [None] * len(batch)
        budgets = [self.token_budget(r.text) for r in batch]
        sizes = self.fragment_schedule.in_tokens(1000 * SAMPLES_PER_TOKEN / self.sample_rate)
        decode_one = functools.partial(self._decode, chat)
        cutters = [self._cutter(sizes, decode_one, r) for r in batch]
        pieces: list[list[Waveform]] = [[] for _ in batch]

        def tell(index: int, made: list[Waveform], *, ended: bool) -> None:
            for n, samples in enumerate(made):
                pieces[index].append(samples)
                if fragment is not None:
                    fragment(index, Piece(len(pieces[index]) - 1, samples, last=ended and n == len(made) - 1))

        def grew(index: int, hidden: torch.Tensor) -> None:
            if waves[index] is None:
                tell(index, cutters[index].grown(hidden), ended=False)

        def made(index: int, hidden: torch.Tensor) -> None:
            # The sampler already ended each item at its budget; the cut makes that a guarantee.
            tell(index, cutters[index].ended(hidden.narrow(0, 0, min(len(hidden), budgets[index]))), ended=True)
            waves[index] = wave = np.concatenate(pieces[index]) if len(pieces[index]) != 1 else pieces[index][0]
            pieces[index] = []
            ready(index, wave)

        def joining() -> decode.Joining | None:
            joined = arrivals() if arrivals is not None else []
            if not joined:
                return None
            waves.extend([None] * len(joined))
            budgets.extend(self.token_budget(r.text) for r in joined)
            cutters.extend(self._cutter(sizes, decode_one, r) for r in joined)
            pieces.extend([] for _ in joined)
            return self._code_prompts(chat, joined, self._refined_texts(chat, joined), budgets[-len(joined) :])

        try:
            with torch.inference_mode(), warnings.catch_warnings():
                # transformers < 5.40 announces a rename ChatTTS 0.2.5 has not made; it is pinned.
                warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
                chat.context.set(False)
                texts = self._refined_texts(chat, batch)
                hiddens = self._code_hiddens(
                    chat, batch, texts, budgets=budgets, made=made, joins=joining,
                    grown=grew if sizes.streams else None,
                )  # fmt: skip
                for index, hidden in enumerate(hiddens):
                    if waves[index] is None:  # ChatTTS's own loop ends every item together
                        made(index, hidden)
        except SynthesisError:
            raise
        except Exception as e:
            raise SynthesisError(f"ChatTTS failed on a batch of {len(waves)}: {e}") from e
        return every_one_made(waves, what="ChatTTS")

    def _cutter(
        self, sizes: FragmentSizes, decode_one: Callable[[torch.Tensor], Waveform], request: SynthesisRequest
    ) -> TokenFragments:
        return TokenFragments(
            sizes, self._window, decode_one, lead_s=self._lead_s, slack_s=request.slack_s,
            opening=not request.playing, sample_rate=self.sample_rate,
        )  # fmt: skip

    def _speaker(self, voice: str | None) -> str | None:
        if voice is None:
            return None
        if voice not in self._speakers:
            raise SynthesisError(f"unknown ChatTTS voice {voice!r}; known voices: {sorted(self._speakers)}")
        return self._speakers[voice]

    def _refined_texts(self, chat: Any, batch: list[SynthesisRequest]) -> list[str]:
        # Our own normaliser ran before; ChatTTS's still drops characters its tokenizer cannot say.
        texts = [chat.normalizer(r.text, False, True, None) for r in batch]
        quality = [i for i, r in enumerate(batch) if r.mode == "quality"]
        if not quality:
            return texts
        params = chat.RefineTextParams(show_tqdm=False)
        prompts = chat.speaker.decorate_text_prompts([texts[i] for i in quality], params.prompt)
        prepared = prepare(
            chat,
            prompts,
            params,
            seeds=[_seed(batch[i]) for i in quality],
            min_tokens=[1] * len(quality),
            max_tokens=[params.max_new_token] * len(quality),
            infer_text=True,
        )
        result = generate(chat, prepared, params, infer_text=True)
        refined = chat.tokenizer.decode([ids[ids.less(chat.tokenizer.break_0_ids)] for ids in result.ids])
        for i, text in zip(quality, refined, strict=True):
            texts[i] = text
        return texts

    def _prompts(self, chat: Any, batch: list[SynthesisRequest], texts: list[str]) -> list[str]:
        return [
            chat.speaker.decorate_code_prompts([text], speed_prompt(r.speed), None, self._speaker(r.voice))[0]
            for r, text in zip(batch, texts, strict=True)
        ]

    def _code_prompts(
        self, chat: Any, batch: list[SynthesisRequest], texts: list[str], budgets: list[int]
    ) -> decode.Joining:
        """Return segments ready for a speech-code pass (its first batch, or to join it while it runs)."""
        return prepare(
            chat,
            self._prompts(chat, batch, texts),
            chat.InferCodeParams(show_tqdm=False),
            seeds=[_seed(r) for r in batch],
            min_tokens=budgets if self._fixed_budget else [1] * len(batch),
            max_tokens=budgets,
            infer_text=False,
            speakers=[self._speaker(r.voice) for r in batch],
        )

    def _code_hiddens(
        self,
        chat: Any,
        batch: list[SynthesisRequest],
        texts: list[str],
        *,
        budgets: list[int],
        made: Callable[[int, torch.Tensor], None],
        joins: decode.Joins,
        grown: decode.Grown | None = None,
    ) -> list[torch.Tensor]:
        result = generate(
            chat,
            self._code_prompts(chat, batch, texts, budgets),
            chat.InferCodeParams(show_tqdm=False),
            infer_text=False,
            finished=lambda index, ids, hidden: made(index, hidden) if hidden is not None else None,
            joins=joins,
            grown=grown,
            static=self._static,
        )
        hiddens: list[torch.Tensor] = result.hiddens
        return hiddens

    def hidden_states(self, batch: list[SynthesisRequest]) -> list[torch.Tensor]:
        """Return each request's speech-code hidden states (tokens, hidden size): what ``decode`` turns into audio."""
        chat = self._chat
        if chat is None:
            raise SynthesisError("ChatTTSEngine.hidden_states called before load")
        budgets = [self.token_budget(r.text) for r in batch]
        with torch.inference_mode():
            chat.context.set(False)
            hiddens = self._code_hiddens(
                chat, batch, self._refined_texts(chat, batch), budgets=budgets, made=lambda i, h: None,
                joins=lambda: None,
            )  # fmt: skip
        return [h.narrow(0, 0, min(len(h), b)) for h, b in zip(hiddens, budgets, strict=True)]

    def code_prompts(self, batch: list[SynthesisRequest]) -> decode.Joining:
        """Return ``batch``'s speech-code prompts as a generation takes them (voices applied, a sampler per item):
        what a measurement replays through ``chattts_generate.generate`` or a forward pass of its own."""
        chat = self._chat
        if chat is None:
            raise SynthesisError("ChatTTSEngine.code_prompts called before load")
        with torch.inference_mode():
            budgets = [self.token_budget(r.text) for r in batch]
            return self._code_prompts(chat, batch, self._refined_texts(chat, batch), budgets)

    def decode(self, hidden: torch.Tensor) -> Waveform:
        """Return the samples ChatTTS's decoder and vocoder make of hidden states (tokens, hidden size)."""
        if self._chat is None:
            raise SynthesisError("ChatTTSEngine.decode called before load")
        return self._decode(self._chat, hidden)

    def _decode(self, chat: Any, hidden: torch.Tensor) -> Waveform:
        # Decoded alone: the convolutions would let a batch's zero padding leak into this item's tail.
        with torch.inference_mode():
            wavs = chat._decode_to_wavs([hidden], True)
        return np.ascontiguousarray(wavs[0], dtype=np.float32)

    def warmup(self) -> None:
        """Run throwaway syntheses that also compile ChatTTS's lazily jitted text code (numba).

        ChatTTS compiles its tag splitting the first time a text has a character it cannot speak
        (a full-width colon, say), and its tag joining when such a text has a [tag]: seconds, in the
        middle of serving, once per model process.
        """
        level = log.level  # ChatTTS logs through ours (see load)
        log.setLevel(logging.ERROR)  # the deliberate invalid character would log a warning
        try:
            self.synthesize([SynthesisRequest(text="warm up"), SynthesisRequest(text="你好：[uv_break]世界")])
        finally:
            log.setLevel(level)

    def unload(self) -> None:
        """Drop the model and give its memory back."""
        self._chat = None
        self._static = None
        self._speakers = {}
        gc.collect()
        if self._device.startswith("cuda"):
            torch.cuda.empty_cache()

    def memory_estimate_mb(self) -> int:
        """Return the size of the model's weights in MiB, counted from the loaded tensors or the files."""
        llama_bytes = PRECISIONS.get(self._precision, torch.int8).itemsize
        total: float
        if self._chat is not None:
            modules = [self._chat.gpt.gpt, self._chat.embed, self._chat.decoder, self._chat.dvae, self._chat.vocos]
            total = sum(t.numel() * t.element_size() for m in modules for t in (*m.parameters(), *m.buffers()))
            total += quantized_bytes(self._chat.gpt.gpt)  # int8 weights are packed, neither parameters nor buffers
            if self._static is not None:  # the static key/value cache is made at load, whole
                total += StaticCache.bytes_for(self._chat.gpt.gpt.config, rows=self._static.cache.rows,
                                               positions=self._static.cache.positions,
                                               dtype=self._chat.gpt.gpt.dtype)  # fmt: skip
        else:
            try:
                _, root = find_weights(self._weights_dir)
            except EngineLoadError:
                return 0
            files = [p for p in (root / "asset").rglob("*.safetensors") if p.is_file()]
            total = sum(p.stat().st_size * (llama_bytes / 4 if p.parent.name == "gpt" else 1) for p in files)
        return math.ceil(total / 2**20)


def _load_random_weights(chat: Any, root: Path, descriptor: dict[str, Any], device: torch.device) -> bool:
    """Load a random-weight model with ChatTTS's own loading code at its descriptor's sizes, skipping the hash check.

    ``Chat.load`` is its hash check (``download_models``) followed by ``Chat._load`` on the asset paths; random
    weights cannot match ChatTTS's map of the real ones, so only the second half runs, with the same arguments.
    """
    log.warning(
        "%s holds RANDOM weights (a %s-size benchmark model, not ChatTTS's): ChatTTS's SHA-256 check of the real "
        "weights is skipped; the audio is noise",
        root,
        descriptor.get("preset", "tiny"),
    )
    chat.config = descriptor_config(descriptor["sizes"])
    paths = {key: str(root / rel) for key, rel in asdict(chat.config.path).items()}
    return bool(chat._load(device=device, compile=False, **paths))


def _seed(request: SynthesisRequest) -> int:
    return 0 if request.seed is None else request.seed
