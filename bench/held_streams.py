"""Event streams held open from one asyncio loop, and a feeder that gives every held job a segment now and then."""

from __future__ import annotations

import asyncio
import threading

from cache.jobstore import JobStore


class HeldStreams:
    """Event streams held open from one asyncio loop in a thread of its own."""

    def __init__(self, port: int, paths: list[str], sources: list[str]) -> None:
        self.port = port
        self.paths = paths
        self.sources = sources
        self.open = 0
        self.failed: list[str] = []
        self.ended = 0
        self.events = 0
        self.loop = asyncio.new_event_loop()
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, timeout_s: float = 120) -> None:
        """Open every stream; return once each has had its first event."""
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"only {self.open} of {len(self.paths)} streams opened in {timeout_s} s")
        if self.failed:
            raise RuntimeError(f"{len(self.failed)} streams refused, e.g. {self.failed[0]}")

    def _run(self) -> None:
        self.loop.run_until_complete(self._open_all())
        self._ready.set()
        self.loop.run_forever()

    async def _open_all(self) -> None:
        limit = asyncio.Semaphore(100)

        async def one(n: int) -> None:
            async with limit:
                await self._open(self.paths[n], self.sources[n % len(self.sources)])

        await asyncio.gather(*(one(n) for n in range(len(self.paths))))

    async def _open(self, path: str, source: str) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, local_addr=(source, 0))
        writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            self.failed.append(head.decode(errors="replace").split("\r\n", 1)[0])
            writer.close()
            return
        await reader.readuntil(b"retry: 1000")
        self._writers.append(writer)
        self.open += 1
        self._tasks.append(self.loop.create_task(self._drain(reader)))

    async def _drain(self, reader: asyncio.StreamReader) -> None:
        while data := await reader.read(65536):  # events and keep-alives, until the server ends the stream
            self.events += data.count(b"event: segment")
        self.ended += 1

    def close(self) -> None:
        """Close every stream and stop the loop."""

        async def close_all() -> None:
            for writer in self._writers:
                writer.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


class Feeder:
    """Write one segment of every held job each ``interval_s``, so that every stream carries an event as often."""

    def __init__(self, store: JobStore, jobs: list[str], *, interval_s: float) -> None:
        self.store = store
        self.jobs = jobs
        self.interval_s = interval_s
        self.written = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        pcm = bytes(2 * 2205)  # 0.1 s of silence at 22,050 Hz
        step = self.interval_s / len(self.jobs)  # the jobs take turns: segments finish spread out, not at once
        while not self._stop.wait(step if self.written else 0):
            job_id = self.jobs[self.written % len(self.jobs)]
            index = self.written // len(self.jobs)
            self.store.write_segment(job_id, index, pcm, sample_rate=22050, meta={"duration_s": 0.1})
            self.written += 1

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
