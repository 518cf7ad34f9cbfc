"""The model host: a spawned subprocess that owns one loaded engine and serves batches over a pipe.

Ending the process gives back all of the model's memory, which an in-process
unload (Python and CUDA allocators keep what they had) does not.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from core.fragments import NO_FRAGMENTS, FragmentSchedule, model_schedule
from core.logs import setup_logging
from core.registry import ModelSpec
from workers.engines.base import Arrivals, SynthesisRequest
from workers.engines.factory import build_engine


def resident_mb() -> float:
    """Return this process's resident memory in MiB (Linux /proc; 0 elsewhere)."""
    try:
        with open(f"/proc/{os.getpid()}/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except OSError:
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def gpu_mb() -> float:
    """Return the GPU memory torch holds in this process, in MiB (0 without CUDA)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return 0.0
    return float(torch.cuda.memory_reserved()) / 2**20


def memory_report() -> dict[str, float]:
    """Return what this host holds: resident and GPU memory."""
    return {"rss_mb": round(resident_mb(), 1), "gpu_mb": round(gpu_mb(), 1)}


def exit_with_parent(parent: int, every_s: float = 0.5) -> None:
    """End this process as soon as its parent is gone (it was reparented), even in the middle of a batch."""
    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(1)


def host_main(
    conn: Connection,
    spec: ModelSpec,
    *,
    builder: str,
    device: str,
    log_level: str,
    torch_threads: int = 0,
    fragments: FragmentSchedule = NO_FRAGMENTS,
    graphs: str = "auto",
) -> None:
    """Load the engine ``builder`` ("module:function") makes, say ready, then serve batches until told to stop.

    A batch is answered with ``("fragment", index, piece)`` messages as each item's fragments are made (cut on
    the model's own schedule, or ``fragments``), a ``("part", index, waveform)`` message per item as each ends,
    then ``("ok", memory)`` (or ``("error", reason)``, after the parts of the items already made). While it runs,
    ``("join", id, requests)`` adds segments to it (answered ``("joined", id)``; their parts follow the batch's);
    one that comes too late, when the call has ended, is answered ``("refused", id)``.
    """
    # A host whose worker was killed would finish its batch for no one, on the CPU or GPU memory the
    # worker's replacement is loading its model into. (Not PR_SET_PDEATHSIG: it fires when the thread
    # that started the host ends, and the pool starts hosts from short-lived threads.)
    threading.Thread(target=exit_with_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    setup_logging(log_level)
    # Ctrl-C reaches the whole process group; the worker decides when a host stops (or its pipe closes).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threads = _Threads(torch_threads if spec.engine == "chattts" else 0)
    threads.set(torch_threads)
    log = logging.getLogger(f"workers.pool.host.{spec.name}")
    try:
        engine = build_engine(spec, device=device, builder=builder)
        engine.set_fragments(model_schedule(fragments, spec.fragment_ms))
        engine.set_graphs(graphs)
        engine.load()
        engine.warmup()
    except Exception as e:
        log.exception("loading %s failed", spec.name)
        conn.send(("error", f"loading {spec.name} failed: {type(e).__name__}: {e}"))
        return
    conn.send(("ready", engine.sample_rate, memory_report(), engine.takes_arrivals, engine.decode_path))
    while True:
        try:
            message: tuple[Any, ...] = conn.recv()
        except (EOFError, OSError):
            break  # the worker went away
        if message[0] == "stop":
            break
        if message[0] == "join":  # it came after the call it meant to join had ended
            conn.send(("refused", message[1]))
            continue
        if message[0] == "threads":
            threads.set(message[1])
            continue
        requests = [SynthesisRequest(**fields) for fields in message[1]]
        threads.set(message[2])
        try:
            # Each waveform goes back the moment it is made; "ok" ends the call.
            engine.synthesize_each(
                requests,
                lambda index, wave: conn.send(("part", index, wave)),
                arrivals(conn, threads),
                lambda index, piece: conn.send(("fragment", index, piece)),
            )
            conn.send(("ok", memory_report()))
        except (BrokenPipeError, EOFError, ConnectionResetError):
            log.info("%s: its worker went away mid-call; stopping", spec.name)  # killed: nothing to report to
            break
        except Exception as e:
            log.exception("synthesis failed")
            try:
                conn.send(("error", f"{type(e).__name__}: {e}"))
            except (BrokenPipeError, ConnectionResetError):
                break
    engine.unload()


class _Threads:
    """The torch threads this host runs on, changed as the worker shares its cores out (only a torch engine's)."""

    def __init__(self, default: int) -> None:
        self.default = default  # 0: leave torch's own
        self.now = 0

    def set(self, count: int) -> None:
        """Run on ``count`` threads from the next operation on (0: the default)."""
        count = count or self.default
        if count and count != self.now and self.default:
            import torch

            torch.set_num_threads(count)
            self.now = count


def arrivals(conn: Connection, threads: _Threads | None = None) -> Arrivals:
    """Return what the engine asks between steps: the segments the worker sent to join this call, each acknowledged.

    An acknowledged segment's waveform comes back as a "part" numbered after those already in the call. While the
    call runs the worker sends nothing else but ``("threads", n)``: the cores this call may use from now on (more
    while the worker's other hosts are idle).
    """

    def joined() -> list[SynthesisRequest]:
        requests: list[SynthesisRequest] = []
        while conn.poll(0):
            message = conn.recv()
            if message[0] == "threads":
                if threads is not None:
                    threads.set(message[1])
                continue
            if message[0] != "join":
                raise RuntimeError(f"model host got {message[0]!r} in the middle of a call")
            conn.send(("joined", message[1]))
            requests += [SynthesisRequest(**fields) for fields in message[2]]
        return requests

    return joined
