"""The HTTP contract as typed models: request bodies are parsed and checked by them, and the OpenAPI
document (api/openapi.py) is generated from them, so the two cannot drift apart."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator

from cache.records import JobStatus
from core.audio import MEDIA_TYPES
from core.policy import Lane

__all__ = ["JobStatus"]  # re-exported: the job view's status is the store's own enum

Mode = Literal["fast", "balanced", "quality"]
Priority = Lane
AudioFormat = Literal["wav", "flac", "ogg", "mp3", "opus", "pcm"]
#: OpenAI's response formats; aac has no encoder in libsndfile and is refused with a reason.
SpeechFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
SPEED_MIN, SPEED_MAX = 0.5, 2.0
SEED_MAX = 2**31 - 1
#: A model or voice name: a registry entry, never a path (the registry resolves it).
Name = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=r"\S")]
Speed = Annotated[float, Field(ge=SPEED_MIN, le=SPEED_MAX, allow_inf_nan=False, description="Speaking rate.")]

if set(get_args(AudioFormat)) != set(MEDIA_TYPES):
    raise RuntimeError("api/contract.py AudioFormat must list exactly core.audio.MEDIA_TYPES")

#: Request bodies: strict types (no "1" for 1, no 1 for true), unknown fields refused, frozen once checked.
_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True)


def _speakable(value: str, info: ValidationInfo) -> str:
    """Refuse blank text (a text stream may open with none), and text longer than the app's limit (passed as
    validation context)."""
    if not value.strip() and not info.data.get("text_stream"):
        raise ValueError("must not be empty")
    limit = (info.context or {}).get("max_text_chars")
    if limit is not None and len(value) > limit:
        raise ValueError(f"is {len(value)} characters; the limit is {limit} (TTS_MAX_TEXT_CHARS)")
    return value


class JobBody(BaseModel):
    """POST /v1/jobs: the text and how to say it. Model and voice are names the registry resolves."""

    model_config = _STRICT

    text_stream: bool = Field(
        False,
        description="Open a job whose text arrives in pieces (POST /v1/jobs/{id}/text); text may then be empty or "
        "its first piece.",
    )
    text: str = Field("", description="What to say; split into segments that play as they finish.")
    model: Name | None = Field(None, description="A model id from /v1/models; the default when absent.")
    voice: Name | None = Field(None, description="A voice of that model; its default when absent.")
    speed: Speed = 1.0
    mode: Mode = Field(
        "balanced",
        description="Which variant of the model serves the job. For ChatTTS: fast (int8, shortest fragments, CPU "
        "only), balanced (the model as declared) or quality (fp32, the closest fragment joins, a text-refinement "
        "pass). A model that declares no modes serves every mode itself; /v1/models says what each mode runs.",
    )
    format: AudioFormat = Field("wav", description="The audio format of segments and the whole file.")
    priority: Priority | None = Field(None, description="The lane; long texts go to batch when absent.")
    seed: int | None = Field(None, ge=0, le=SEED_MAX, description="Fixes sampling: the same seed, the same audio.")
    cache: bool = Field(True, description="Reuse and fill the sentence cache.")

    _text = field_validator("text")(_speakable)


class SpeechBody(BaseModel):
    """POST /v1/audio/speech, as OpenAI defines it, and as strict as every body: a misspelt field is refused, not
    silently dropped. OpenAI's fields that this service has no use for (``instructions``, and ``stream_format`` as
    audio) are declared, accepted and ignored, so that OpenAI's SDKs work unchanged; an SSE stream, which this
    service does not make, is refused rather than answered with bytes its client does not expect."""

    model_config = _STRICT

    input: str = Field(min_length=1, description="What to say.")
    model: Name | None = Field(None, description="tts-1, tts-1-hd or gpt-4o-mini-tts (the default model), or an id.")
    voice: Name | None = Field(None, description="An OpenAI voice name (mapped to ours) or one of the model's.")
    response_format: SpeechFormat = "mp3"
    speed: Speed = 1.0
    instructions: str | None = Field(None, description="OpenAI's direction of the voice: accepted and ignored.")
    stream_format: Literal["sse", "audio"] | None = Field(
        None, description="OpenAI's choice of stream: audio (the answer is the audio itself); sse is refused."
    )

    _input = field_validator("input")(_speakable)

    @field_validator("stream_format")
    @classmethod
    def _audio_only(cls, value: str | None) -> str | None:
        if value == "sse":
            raise ValueError("sse is not available here: the answer is the audio itself, chunked; omit it or use audio")
        return value

    @field_validator("response_format")
    @classmethod
    def _encodable(cls, value: str) -> str:
        if value == "aac":
            raise ValueError("aac is not available here; use mp3, opus, flac, wav or pcm")
        return value


class TextPieceBody(BaseModel):
    """POST /v1/jobs/{id}/text: one piece of a text stream's text, in ``seq`` order (0, 1, 2, …)."""

    model_config = _STRICT

    seq: int = Field(ge=0, le=10**9, description="The piece's place in the stream; a retry sends the same seq.")
    text: str = Field("", description="The piece, as short as one token; only the final piece may be empty.")
    final: bool = Field(False, description="The last piece: the job ends once everything before it is spoken.")

    @field_validator("text")
    @classmethod
    def _bounded(cls, value: str, info: ValidationInfo) -> str:
        limit = (info.context or {}).get("max_text_chars")
        if limit is not None and len(value) > limit:
            raise ValueError(f"is {len(value)} characters; the limit is {limit} (TTS_MAX_TEXT_CHARS)")
        return value


class TextStreamView(BaseModel):
    """Where a text stream stands: open for more pieces, or closed (and why)."""

    open: bool
    next_seq: int = Field(ge=0, description="The next piece the stream expects.")
    end_reason: str | None = Field(None, description='"final", or the idle time after which it ended.')


class PieceView(BaseModel):
    """The answer to one piece: whether it was new or a retry, and the job's segments so far."""

    seq: int
    duplicate: bool = Field(description="The same seq and text arrived before: answered again, spoken once.")
    segments_total: int = Field(ge=0, description="Segments planned so far; final once the stream is closed.")
    text_stream: TextStreamView


class JobUrls(BaseModel):
    """Where to follow the job."""

    self: str
    audio: str
    events: str
    segment: str = Field(description="A template: replace {index} with a segment's index.")


class JobView(BaseModel):
    """A job's status and progress, as every job route answers it."""

    id: str
    status: JobStatus
    segments_total: int = Field(ge=0)
    segments_done: int = Field(ge=0)
    cached_segments: int = Field(ge=0)
    progress: float = Field(ge=0, le=1)
    model: str
    voice: str
    format: AudioFormat
    priority: Priority
    speed: float
    mode: Mode
    seed: int | None
    chars_total: int = Field(ge=0)
    created_at: float
    started_at: float | None
    finished_at: float | None
    sample_rate: int | None
    first_due_at: float | None = Field(description="When segment 0 is due (epoch seconds).")
    start_estimate_s: float | None = Field(description="Estimated seconds from acceptance until segment 0 starts.")
    audio_expires_at: float | None = Field(
        description="When a finished job's audio stops being kept (epoch seconds); 410 gone after it."
    )
    audio_removed_at: float | None = Field(
        description="When the memory budget removed a finished job's audio early (epoch seconds)."
    )
    error: str | None = Field(None, description="Why the job failed or was canceled.")
    text_stream: TextStreamView | None = Field(
        None, description="For a job whose text arrives in pieces; segments_total grows until it closes."
    )
    urls: JobUrls


class ErrorDetail(BaseModel):
    """One error; ``field`` names the request field at fault, other keys add what the code needs."""

    model_config = ConfigDict(extra="allow")

    code: str = Field(description="Stable, machine-readable: invalid_field, not_found, store_full, …")
    message: str = Field(description="What went wrong and what to do.")
    field: str | None = None
    retry_after: int | None = None


class ErrorBody(BaseModel):
    """Every error answer."""

    error: ErrorDetail


class ModeView(BaseModel):
    """What one mode of a model runs."""

    model: str = Field(description="The variant serving it (model@mode; the model itself for balanced).")
    precision: str = Field(description="fp32, fp16, bf16 or int8 (fp16/bf16 run in fp32 on CPUs without them).")
    devices: list[str] = Field(description="The kinds of device it runs on: cpu, cuda.")
    fragment_ms: str | None = Field(None, description="Its own fragment schedule; null: the service's.")


class ModelView(BaseModel):
    """One registry entry."""

    model_config = ConfigDict(extra="allow")

    id: str
    engine: str
    available: bool
    random_weights: bool = Field(False, description="A random-weight benchmark model: real compute, noise for audio.")
    voices: list[str]
    modes: dict[str, ModeView] = Field(default_factory=dict, description="fast, balanced and quality: what each runs.")


class ModelsView(BaseModel):
    """GET /v1/models."""

    model_config = ConfigDict(extra="allow")

    default: str
    data: list[ModelView]


class FragmentEvent(BaseModel):
    """The data of a ``fragment`` event (GET /v1/jobs/{id}/events?fragments=1; id ``<index>.<fragment>``): one
    fragment of a segment's audio as the model made it, inline. A segment's fragments join into its audio."""

    index: int = Field(ge=0, description="The segment it belongs to.")
    fragment: int = Field(ge=0, description="Its place in the segment: 0, 1, 2, …")
    samples: int = Field(ge=0)
    duration_s: float | None
    sample_rate: int | None
    last: bool = Field(
        description="The segment's last fragment, as far as was known when it was sent; the segment's own event "
        "always follows its last."
    )
    pcm16: str = Field(description="Its audio: base64 of raw 16-bit little-endian mono PCM.")


class SegmentEvent(BaseModel):
    """The data of a ``segment`` event (id ``<index>``): a segment is whole; with fragments, after its last one."""

    index: int = Field(ge=0)
    duration_s: float | None
    url: str = Field(description="Its audio in the job's format.")
    segments_total: int | None = Field(description="null while a text stream is open: more segments may come.")


#: What the document's components hold, and how each is used (validation: as a request; serialization: a reply).
SCHEMAS: list[tuple[type[BaseModel], Literal["validation", "serialization"]]] = [
    (JobBody, "validation"),
    (SpeechBody, "validation"),
    (TextPieceBody, "validation"),
    (JobView, "serialization"),
    (PieceView, "serialization"),
    (ErrorBody, "serialization"),
    (ModelsView, "serialization"),
    (FragmentEvent, "serialization"),
    (SegmentEvent, "serialization"),
]


def allowed_fields(model: type[BaseModel]) -> list[str]:
    """Return the fields a request body may hold."""
    return sorted(model.model_fields)


def as_json(view: BaseModel) -> dict[str, Any]:
    """Return a reply model as the JSON-ready dict Flask sends."""
    return view.model_dump(mode="json")
