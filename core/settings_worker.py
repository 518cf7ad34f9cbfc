"""Settings of a worker: its threads, batching and deadline scheduling, model pool, heartbeat."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from core.fragments import FragmentSchedule
from core.lanes import Scheduler


class WorkerSettings(BaseSettings):
    """What a worker process reads: how it orders, batches and runs segments, and how it shows it is alive."""

    worker_concurrency: int = Field(
        128,
        ge=1,
        description="Segments one worker holds at once (threads): the window its deadline scheduler orders; "
        "several times the batch size lets batches fill.",
    )
    worker_layout: Literal["per-device", "one"] = Field(
        "per-device",
        description="How `make run` and `make worker` start workers on a machine with GPUs. `per-device`: one "
        "worker pinned to each GPU; `one`: a single worker with a model host on each GPU, batching from them all.",
    )
    model_replicas: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = Field(
        "auto",
        description="Host processes per model in each worker, running batches side by side. `auto`: one per core "
        "on CPUs (at most 8, the cores shared among them), one per GPU; the worker logs what it chose.",
    )
    batch_max_size: int = Field(16, ge=1, description="Most segments in one engine call.")
    batch_wait_ms: float = Field(
        10.0, ge=0, description="How long the batcher waits for company after a segment arrives."
    )
    batch_max_ratio: float = Field(1.5, ge=1.0, description="Longest/shortest text length allowed in one batch.")
    batch_join: bool = Field(
        True,
        description="Let a segment that must start now join an engine call already running, between its decode "
        "steps, when every model host is busy (ChatTTS only). Off: it waits for a call to end.",
    )
    fragment_ms: str = Field(
        "150,400",
        description="How a segment's audio is cut as it is made, in milliseconds: the first fragment, then the "
        "steady ones (`first,steady[,shortest]`); `off` sends each segment whole.",
    )
    cuda_graphs: Literal["auto", "on", "off"] = Field(
        "auto",
        description="How ChatTTS runs a decode step. `auto`: on a GPU, one CUDA graph per batch bucket over a static "
        "key/value cache, checked against the eager step at load; on a CPU, the eager loop; `on`: the static cache "
        "on CPUs too; `off`: the eager loop everywhere.",
    )
    scheduler: Scheduler = Field(
        "deadline",
        description="Order of work: `deadline` (earliest playback deadline first) or `fifo` (arrival order).",
    )
    batch_hold_ms: float = Field(
        150.0, ge=0, description="How long a batch may wait to fill while its most urgent segment still has slack."
    )
    batch_horizon_s: float = Field(
        30.0, ge=0, description="A batch only takes segments due within this many seconds of its most urgent one."
    )
    batch_urgent_horizon_s: float = Field(
        2.0,
        ge=0,
        description="A batch whose most urgent segment must start now only takes segments due within this many "
        "seconds of it, unless the engines are behind. Larger fills such batches more.",
    )
    deadline_lead: float = Field(
        2.0,
        ge=0,
        description="A playing stream's next segment is ordered this many engine calls (the recent average, longer "
        "for a longer text) before its deadline, so that it is written by then.",
    )
    deadline_first_priority_s: float = Field(
        2.0,
        ge=0,
        description="A job's first segment is ordered as many seconds before its deadline as it is already late, "
        "up to this, so that under overload a listener who has heard nothing yet is served first.",
    )
    deadline_first_audio_s: float = Field(
        1.0, ge=0, description="Expected first-audio time of a realtime job: its listener's start until known."
    )
    deadline_batch_delay_s: float = Field(
        60.0, ge=0, description="A batch-lane job's first segment is due this long after acceptance."
    )
    deadline_batch_stretch: float = Field(
        2.0, ge=1.0, description="Batch-lane deadlines assume a listener this many times slower than real time."
    )
    seconds_per_char: float = Field(
        0.2, gt=0, description="Audio seconds per character assumed for a model until its own pace is measured."
    )
    model_budget_mb: int = Field(
        8192, ge=64, description="Memory all loaded models may hold (GPU memory on CUDA, resident on CPU)."
    )
    model_idle_s: float = Field(
        600.0, gt=0, description="Models idle this long are unloaded, except pinned ones and the default."
    )
    torch_threads: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto",
        description="CPU threads per model host for torch; 0 keeps torch's default. `auto`: the usable cores "
        "shared among the model hosts (one each when there is a host per core).",
    )
    metrics_port: int = Field(9310, ge=0, le=65535, description="Worker's Prometheus port; 0 turns it off.")
    log_format: str = Field("text", pattern="^(text|json)$", description="Log lines as text or JSON.")
    heartbeat_s: float = Field(
        2.0,
        gt=0,
        description="How often a worker announces itself in Redis, and looks for dead workers and unpublished "
        "segments.",
    )
    malloc_trim_s: float = Field(
        60.0,
        ge=0,
        description="How often a worker gives its free heap pages back to the system (glibc malloc_trim); 0 = never.",
    )
    heartbeat_misses: int = Field(
        3,
        ge=2,
        description="A worker whose heartbeat is this many intervals old is dead: its segments are enqueued again.",
    )

    @field_validator("fragment_ms")
    @classmethod
    def _fragment_schedule(cls, value: str) -> str:
        FragmentSchedule.parse(value)  # a ValueError here names the setting
        return value

    @property
    def fragments(self) -> FragmentSchedule:
        """Return the fragment schedule ``fragment_ms`` sets."""
        return FragmentSchedule.parse(self.fragment_ms)

    @property
    def worker_dead_after_s(self) -> float:
        """Return how old a worker's last heartbeat is when the worker counts as dead."""
        return self.heartbeat_misses * self.heartbeat_s
