"""Prometheus metrics, named once here so the API, the workers and the dashboards agree.

Under gunicorn with several processes, set PROMETHEUS_MULTIPROC_DIR (scripts/run.sh
does): every process then writes its samples there and /metrics merges them.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)

# API
HTTP_REQUESTS = Counter("tts_http_requests_total", "HTTP requests by route, method and status.",
                        ["route", "method", "status"])  # fmt: skip
HTTP_SECONDS = Histogram("tts_http_request_seconds", "HTTP request latency by route.", ["route"],
                         buckets=LATENCY_BUCKETS)  # fmt: skip
JOBS_SUBMITTED = Counter("tts_jobs_submitted_total", "Jobs accepted, by lane.", ["lane"])
ADMISSION_REJECTIONS = Counter("tts_admission_rejections_total", "Requests refused before queueing, by reason.",
                               ["reason"])  # fmt: skip
ADMISSION_RETRIES_ADMITTED = Counter(
    "tts_admission_retries_admitted_total",
    "Realtime requests let in on a retry after their Retry-After, judged without the margin kept for retries.",
)
REPLICA_CONFIRMATIONS = Counter(
    "tts_replica_confirmations_total",
    "Confirmations that replicas hold what the service promised, wrote or served (Redis WAIT): confirmed, short "
    "(too few replicas in time), other_node (a reply came from a node that is no longer the primary), failed.",
    ["result"],
)
CACHE_LOOKUPS = Counter("tts_cache_lookups_total", "Sentence-cache lookups by result (hit, miss).", ["result"])
QUEUE_DEPTH = Gauge("tts_queue_depth", "Segment tasks waiting per lane.", ["lane"], multiprocess_mode="mostrecent")
SEGMENTS_OUTSTANDING = Gauge("tts_segments_outstanding",
                             "Segments accepted and not yet written (in the broker, held by a worker or running), "
                             "by whether their deadline has passed (due) or not (later): the scaling signal.",
                             ["state"], multiprocess_mode="mostrecent")  # fmt: skip

# Workers
CACHE_BYTES_STORED = Counter("tts_cache_bytes_stored_total", "Bytes of PCM written to the sentence cache.")
BATCH_SIZE = Histogram("tts_batch_size", "Segments per engine call.", ["model"],
                       buckets=(1, 2, 4, 6, 8, 12, 16, 24, 32, 64))  # fmt: skip
SYNTHESIS_SECONDS = Histogram("tts_synthesis_seconds", "Wall time of one batched engine call.", ["model"],
                              buckets=LATENCY_BUCKETS)  # fmt: skip
AUDIO_SECONDS = Counter("tts_audio_seconds_total", "Seconds of audio produced.", ["model"])
REAL_TIME_FACTOR = Histogram("tts_real_time_factor", "Synthesis seconds per audio second, per segment.", ["model"],
                             buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5))  # fmt: skip
QUEUE_WAIT = Histogram("tts_queue_wait_seconds", "From job submission to the start of a segment's synthesis.",
                       buckets=LATENCY_BUCKETS)  # fmt: skip
TIME_TO_FIRST_SEGMENT = Histogram("tts_time_to_first_segment_seconds", "From job submission to segment 0 written.",
                                  buckets=LATENCY_BUCKETS)  # fmt: skip
SEGMENT_LATENESS = Histogram("tts_segment_lateness_seconds",
                             "Segment written minus its playback deadline (negative: early), by lane.", ["lane"],
                             buckets=(-60, -30, -10, -5, -2, -1, -0.5, -0.1, 0, 0.1, 0.5, 1, 2, 5, 10, 30,
                                      60))  # fmt: skip
JOB_STALLS = Histogram("tts_job_stalls", "Playback stalls per finished job (a listener starting at first audio).",
                       ["lane"], buckets=(0, 1, 2, 3, 5, 10, 20))  # fmt: skip
JOB_STALL_SECONDS = Histogram("tts_job_stall_seconds", "Total seconds a listener would have waited, per job.",
                              ["lane"], buckets=(0, 0.1, 0.5, 1, 2, 5, 10, 30, 60))  # fmt: skip
SEGMENTS = Counter("tts_segments_total", "Segment tasks by outcome (written, duplicate, skipped, gave_up).",
                   ["outcome"])  # fmt: skip
SEGMENT_RETRIES = Counter("tts_segment_retries_total", "Segment attempts that failed and were retried.")
SEGMENT_FAILURES = Counter("tts_segment_failures_total", "Segments given up on (their job failed).")
SEGMENT_REDELIVERIES = Counter(
    "tts_segment_redeliveries_total",
    "Deliveries of a task whose attempt already holds its segment (not counted again).",
)
SEGMENTS_HANDED_OVER = Counter(
    "tts_segments_handed_over_total", "Segments taken from a worker known dead (heartbeat expired) and enqueued again."
)
OUTBOX_PUBLISHED = Counter(
    "tts_outbox_published_total",
    "Segments the janitor published from the outbox (their taker died or lost Redis first).",
)
UPKEEP_FAILURES = Counter(
    "tts_upkeep_failures_total",
    "Worker upkeep steps (janitor pass, text-stream sweep, reconcile, ...) that failed; the next pass runs anyway.",
    ["step"],
)
STORE_FULL_WAITS = Counter(
    "tts_store_full_waits_total", "Segment writes refused by a job store at its memory limit (retried, not failed)."
)
STORE_TRIMMED = Counter(
    "tts_store_trimmed_total",
    "Finished jobs' audio and cache entries removed early to keep the job store inside its memory budget "
    "(kind job_audio, cache_entry), and live jobs failed when live work alone filled it (live_job).",
    ["kind"],
)
STORE_USED = Gauge(
    "tts_store_used_ratio", "The job store's used memory as a share of its budget.", multiprocess_mode="mostrecent"
)
STORE_RESERVED = Gauge(
    "tts_store_reserved_ratio",
    "The audio admitted jobs have reserved and not yet written (cache/reservations.py), as a share of the job "
    "store's budget: admission counts it as used.",
    multiprocess_mode="mostrecent",
)
MODEL_LOADS = Counter("tts_model_loads_total", "Model host processes started.", ["model"])
MODEL_LOAD_FAILURES = Counter(
    "tts_model_load_failures_total", "Model loads that failed (each fails its segment's attempt).", ["model"]
)
MODEL_LOAD_SECONDS = Histogram("tts_model_load_seconds", "Time to start a model host and load its model.", ["model"],
                               buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120))  # fmt: skip
MODEL_EVICTIONS = Counter("tts_model_evictions_total", "Models unloaded to make room or after idling.",
                          ["model", "reason"])  # fmt: skip
MODELS_RESIDENT = Gauge("tts_models_resident", "Models loaded in this worker.", multiprocess_mode="livesum")
MODEL_MEMORY = Gauge("tts_model_memory_mb", "Memory held by each loaded model, its replicas together.", ["model"],
                     multiprocess_mode="livesum")  # fmt: skip
GPU_MEMORY = Gauge("tts_gpu_memory_mb", "GPU memory reserved by each loaded model, its replicas together.", ["model"],
                   multiprocess_mode="livesum")  # fmt: skip
