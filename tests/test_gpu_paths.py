"""What the GPU check runs, first run on the CPU: the half-precision Llama, the device paths, the memory readers,
the stage clock and the tables (bench/gpu_check*.py, bench/engine_real.py), on the tiny model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from bench import gpu_check
from bench.engine_real import combine, document, run_batches, settings_to_try
from bench.gpu_check import Check, engine_table, new_length_table, parse_args, run_engine, service_table
from bench.gpu_check import main as gpu_check_main
from bench.gpu_check_engine import EngineCell, measure_new_lengths, measure_precision, pick_texts
from bench.gpu_check_service import level_summary, models_file, served_path
from bench.loadgen import JobResult, LevelRun
from workers.engines.base import SynthesisRequest
from workers.engines.chattts import ChatTTSEngine, cpu_multiplies_natively
from workers.engines.chattts_device import (
    device_name,
    memory_budget,
    on_cuda,
    peak_memory_mb,
    reset_peak_memory,
    synchronize,
)
from workers.engines.chattts_stages import STAGES, StageClock
from workers.engines.sampling import PerItemSampler

TEXTS = ["你好。", "今天天气很好。", "我们一起去公园散步吧。"]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Run torch on one thread, as the engine tests do: the tiny model's ops are too small to share."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_registry(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the registry's chattts-tiny at the session's tiny model."""
    monkeypatch.setenv("TTS_TINY_MODEL_DIR", str(tiny_model_dir))


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[ChatTTSEngine]:
    """Return the tiny model loaded on the CPU, each segment exactly its token budget."""
    loaded = ChatTTSEngine(weights_dir=tiny_model_dir, device="cpu", max_tokens=48, fixed_token_budget=True)
    loaded.load()
    yield loaded
    loaded.unload()


def test_the_device_readers_answer_without_cuda() -> None:
    for device in ("cpu", "cuda:0") if not torch.cuda.is_available() else ("cpu",):
        assert not on_cuda(device)
        synchronize(device)
        reset_peak_memory(device)
        assert peak_memory_mb(device) is None
        assert memory_budget(device) is None
    assert device_name("cpu").startswith("CPU")


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("graphs", ["off", "on"])
def test_each_precision_runs_the_gpu_checks_engine_cell_on_the_cpu_eager_and_on_the_static_step(
    tiny_registry: None, precision: str, graphs: str
) -> None:
    cells = measure_precision("chattts-tiny", precision=precision, device="cpu", batches=[1, 3], steps=24, pool=TEXTS,
                              warm=True, graphs=graphs, static_rows=3)  # fmt: skip
    assert [c.batch for c in cells] == [1, 3]
    wanted = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[precision]
    for cell in cells:
        # A CPU without that matmul runs fp32 (and says so in the log); the cell says what it ran.
        assert cell.llama_dtype in (wanted, "float32")
        assert cell.steps == 24 and cell.tokens_per_s > 0 and cell.step_ms == pytest.approx(1000 * cell.seconds / 24)
        assert cell.audio_s_per_s == pytest.approx(cell.tokens_per_s * 512 / 24000)
        assert cell.peak_memory_mb is None and cell.graphs == graphs
        if graphs == "on":  # nothing to capture on a CPU: the static cache's step runs eagerly, and the table says so
            assert cell.decode_path.startswith("static cache, eager step") and (cell.capture_s or 0) > 0
        else:
            assert cell.decode_path.startswith("growing cache") and cell.capture_s is None


def test_the_llama_is_cast_to_half_precision_when_asked_even_on_the_cpu(tiny_model_dir: Path) -> None:
    for precision, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        engine = ChatTTSEngine(weights_dir=tiny_model_dir, device="cpu", precision=precision, half_on_cpu=True)
        engine.load()
        assert engine.llama_dtype in (dtype, torch.float32), "fp32 only where the matmul is missing altogether"
        assert next(engine.chat.decoder.parameters()).dtype == torch.float32, "the decoder stays fp32"
        engine.synthesize([SynthesisRequest(text=TEXTS[0])])
        engine.unload()


def test_half_precision_hands_the_llama_every_position_exactly_past_what_bf16_can_hold(tiny_model_dir: Path) -> None:
    engine = ChatTTSEngine(weights_dir=tiny_model_dir, device="cpu", precision="bf16", half_on_cpu=True,
                           tokens_per_char=1000.0, max_tokens=300, fixed_token_budget=True)  # fmt: skip
    engine.load()
    assert engine.llama_dtype == torch.bfloat16, "torch's CPU build multiplies bf16, slowly"
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def record(module: object, args: object, kwargs: dict[str, torch.Tensor]) -> None:
        seen.append((kwargs["position_ids"], kwargs["cache_position"]))

    hook = engine.chat.gpt.gpt.register_forward_pre_hook(record, with_kwargs=True)
    try:
        engine.synthesize([SynthesisRequest(text=TEXTS[0])])
    finally:
        hook.remove()
        engine.unload()
    assert all(not p.is_floating_point() and not c.is_floating_point() for p, c in seen)
    last = [int(p[0, -1]) for p, _ in seen]
    assert last[-1] > 256, "bf16 holds integers exactly only up to 256"
    assert last == list(range(last[0], last[0] + len(last))), "one position further each step, none rounded"
    assert [int(c[-1]) for _, c in seen] == last, "one item, no padding: the cache position is the position"


def test_half_precision_runs_in_fp32_on_a_cpu_without_native_half_matmuls(tiny_model_dir: Path) -> None:
    engine = ChatTTSEngine(weights_dir=tiny_model_dir, device="cpu", precision="fp16")
    engine.load()
    native = cpu_multiplies_natively(torch.float16)
    assert engine.llama_dtype == (torch.float16 if native else torch.float32)
    engine.unload()


def test_native_half_matmuls_are_read_from_the_cpu_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 f16c avx512_bf16\n", encoding="utf-8")
    assert cpu_multiplies_natively(torch.bfloat16, cpuinfo)
    assert not cpu_multiplies_natively(torch.float16, cpuinfo), "f16c converts; it does not multiply"
    assert not cpu_multiplies_natively(torch.float16, tmp_path / "missing")


def test_the_stage_clock_times_every_stage_and_puts_chattts_back(engine: ChatTTSEngine) -> None:
    chat = engine.chat
    clock = StageClock()
    with clock.installed(chat):
        engine.synthesize([SynthesisRequest(text=t) for t in TEXTS])
    assert all(clock.calls[stage] > 0 and clock.seconds[stage] > 0 for stage in STAGES)
    assert clock.calls["decoder"] == clock.calls["vocoder"] == len(TEXTS), "each item is decoded alone"
    shares = clock.shares(sum(clock.seconds.values()) * 1.25)
    assert abs(sum(shares.values()) - 1) < 1e-9 and shares["other"] == pytest.approx(0.2)
    for owner, name in ((chat.gpt.gpt, "forward"), (chat.decoder, "forward"), (chat, "_vocos_decode")):
        assert name not in vars(owner)
    assert PerItemSampler.sample.__name__ == "sample" and not hasattr(PerItemSampler.sample, "__wrapped__")


def test_the_engine_table_runs_a_pool_in_length_sorted_batches(engine: ChatTTSEngine) -> None:
    row = run_batches(engine, TEXTS * 2, batch=3, seconds=float("inf"), seed=1)
    assert row["segments"] == 6 and row["tokens"] == sum(engine.token_budget(t) for t in TEXTS * 2)
    combined = combine([{**row, "loaded_mb": 100.0}, {**row, "loaded_mb": 50.0}])  # two replicas side by side
    assert combined["segments"] == 12 and combined["loaded_mb"] == 150.0
    assert combined["chars_per_s"] > 0 and abs(sum(combined["shares"].values()) - 1) < 1e-9
    args = {"pool": 6, "tokens_per_char": 6.0, "max_tokens": 48, "batch1_seconds": 1.0}
    setting = {"threads": 1, "replicas": 1, "precision": "fp32", "rows": [combined]}
    int8 = {**setting, "precision": "int8", "rows": [{**combined, "tokens_per_s": 2 * combined["tokens_per_s"]}]}
    markdown = document({"args": args, "settings": [setting], "precisions": [setting, int8], "settings_batches": [3],
                         "pool_mean_chars": 7.0, "build_s": 0.0, "wall_s": 1.0,
                         "best": {**combined, "threads": 1, "replicas": 1}})  # fmt: skip
    assert "| fp32 | 3 | 12 |" in markdown and "| int8 | 3 | 12 |" in markdown and "| 2.00× |" in markdown
    assert "TTS_MODEL_REPLICAS=1" in markdown
    assert settings_to_try(2) == [(2, 1), (1, 2)] and settings_to_try(1) == [(1, 1)]


def test_the_rehearsal_is_the_gpu_check_on_the_cpu_with_a_small_step_count() -> None:
    args = parse_args(["--rehearse"])
    assert (args.device, args.steps, args.service_max_tokens, args.batches) == ("cpu", 24, 24, "1,4,16")
    assert (args.levels, args.window) == ("1,4", 60), "few callers, long enough for real-size jobs to finish"
    gpu = parse_args([])
    assert (gpu.device, gpu.steps, gpu.batches, gpu.window, gpu.drain, gpu.levels) == (
        "cuda:0", 128, "1,16,64", 20, 15, "1,16,64"
    )  # fmt: skip
    assert (gpu.precisions, gpu.graphs) == ("fp32,fp16,bf16", "off,on"), "eager against graphs in each precision"
    assert gpu.service_precision is None, "on a GPU the service runs the registry's precision"
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="--rehearse"):
            gpu_check_main([])


def _cell(graphs: str, batch: int, tokens_per_s: float) -> EngineCell:
    path = "growing cache, eager step (graphs off)" if graphs == "off" else "static cache, CUDA graphs for buckets 1"
    return EngineCell(precision="fp16", llama_dtype="float16", graphs=graphs, decode_path=path, batch=batch, steps=128,
                      seconds=128 / tokens_per_s * batch, step_ms=1000 * batch / tokens_per_s,
                      tokens_per_s=tokens_per_s, audio_s_per_s=tokens_per_s * 512 / 24000, peak_memory_mb=2048.0,
                      capture_s=None if graphs == "off" else 4.5)  # fmt: skip


def test_the_engine_table_sets_graphs_beside_eager_at_each_batch_and_the_service_table_has_a_row_per_level(
    tmp_path: Path,
) -> None:
    cells = [_cell("off", 1, 50.0), _cell("off", 16, 600.0), _cell("on", 1, 250.0), _cell("on", 16, 3000.0)]
    lines = engine_table(cells)
    assert [line.split(" | ")[1:3] for line in lines[2:]] == [["1", "off"], ["1", "on"], ["16", "off"], ["16", "on"]]
    assert "| 5.00× | 2048 | 4.50 | static cache, CUDA graphs for buckets 1 |" in lines[3]
    assert "| 1.00× | 2048 | – | growing cache, eager step (graphs off) |" in lines[2]
    results = [JobResult(chars=5, submitted=1.0, done=3.0, first_audio=1.5, segments=[(1.5, 0.2), (2.5, 1.0)])]
    level = level_summary(LevelRun(callers=1, window_start=0.0, window_end=10.0, results=results, unfinished=0))
    assert level.jobs_ok == 1 and level.first_audio_p95_s == pytest.approx(0.5)
    assert level.gap_share == 1.0 and level.gap_p95_s == pytest.approx(0.8), "the second fragment came 0.8 s late"
    lines = service_table([level])
    assert len(lines) == 3 and lines[2].startswith("| 1 | 0.10 (1 jobs) | ")
    assert "| 0.50 / 0.50 | 100% | 0.80 | 0 | 0 |" in lines[2], "first audio, listeners with a gap, refusals, errors"
    registry = models_file(tmp_path, "chattts-random", {"max_tokens": 24})
    assert '"max_tokens": 24' in registry.read_text(encoding="utf-8")


def test_the_gpu_check_writes_its_tables_after_every_engine_cell(tiny_registry: None, tmp_path: Path) -> None:
    args = parse_args(["--device", "cpu", "--model", "chattts-tiny", "--no-build", "--precisions", "fp32",
                       "--batches", "1,2", "--steps", "24", "--new-lengths", "", "--skip-service",
                       "--torch-threads", "1", "--out", str(tmp_path)])  # fmt: skip
    written: list[str] = []
    check = Check(args, "a CPU", tmp_path, save=lambda name, markdown: written.append(markdown))
    run_engine(check, TEXTS)
    assert len(written) == 4, "one write per cell: eager and the static step at batch 1 and 2"
    assert "*Written as the run goes: 1 of 4 engine cells" in written[0]
    assert "| fp32 (float32) | 1 | off |" in written[0] and "| 1 | on |" not in written[0]
    assert "| fp32 (float32) | 2 | on |" in written[-1] and "static cache, eager step" in written[-1]
    assert '"graphs": "on"' in (tmp_path / "gpu_check.json").read_text(encoding="utf-8")
    check.finished = True
    assert "Written as the run goes" not in gpu_check.document(check)


def test_an_engine_load_that_fails_is_noted_and_the_rest_still_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    args = parse_args(["--device", "cpu", "--precisions", "fp32,fp16", "--batches", "1", "--new-lengths", "",
                       "--skip-service", "--out", str(tmp_path)])  # fmt: skip
    ran: list[tuple[str, str]] = []

    def measure(model: str, *, precision: str, graphs: str, done: Callable[[EngineCell], None], **_: object) -> None:
        ran.append((precision, graphs))
        if (precision, graphs) == ("fp32", "on"):
            raise RuntimeError("CUDA out of memory")
        done(_cell(graphs, 1, 100.0))

    monkeypatch.setattr(gpu_check, "measure_precision", measure)
    written: list[str] = []
    check = Check(args, "a CPU", tmp_path, save=lambda name, markdown: written.append(markdown))
    run_engine(check, TEXTS)
    # Every eager load first: a graph fault that broke the CUDA context would lose the eager rows too.
    assert ran == [("fp32", "off"), ("fp16", "off"), ("fp32", "on"), ("fp16", "on")]
    assert check.engine_errors == ["fp32, graphs on: RuntimeError: CUDA out of memory"]
    assert "**An engine load failed:** fp32, graphs on: RuntimeError: CUDA out of memory" in written[-1]


def test_the_gpu_check_times_the_decoder_at_lengths_it_has_not_seen_and_again(engine: ChatTTSEngine) -> None:
    probes = measure_new_lengths(engine, device="cpu", lengths=[37, 53])
    assert [p.tokens for p in probes] == [37, 53]
    assert all(p.first_s > 0 and p.again_s > 0 for p in probes)
    lines = new_length_table(probes)
    assert lines[-2].startswith("| 37 | ") and lines[-1].startswith("| 53 | ")
    assert new_length_table([]) == [], "no probe, no table"


def test_pick_texts_spreads_a_batch_over_the_lengths() -> None:
    pool = ["a" * n for n in range(1, 11)]
    assert [len(t) for t in pick_texts(pool, 5)] == [1, 3, 5, 7, 9]
    assert len(pick_texts(pool, 64)) == 64


def test_the_service_table_says_which_decode_path_served_and_whether_a_call_outgrew_the_static_cache(
    tmp_path: Path,
) -> None:
    log = tmp_path / "worker.log"
    assert served_path(log) is None, "no log yet"
    loaded = "INFO workers.pool.handle: model chattts-random loaded in pid 7 in 9.1s; decode step: "
    log.write_text(loaded + "static cache, CUDA graphs for batch buckets 1,2,4 × widths 128,256\n")
    assert served_path(log) == "static cache, CUDA graphs for batch buckets 1,2,4 × widths 128,256"
    with log.open("a") as f:
        f.write(
            "WARNING workers.engines.static_step: a call of 70 rows over 300 columns does not fit the static "
            "cache (64 × 768): it runs on the growing loop; raise static_rows or static_positions\n"
        )
    assert served_path(log) == (
        "static cache, CUDA graphs for batch buckets 1,2,4 × widths 128,256; a call outgrew the static cache and ran "
        "on the growing loop"
    )
