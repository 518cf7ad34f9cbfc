"""A Redis Sentinel group on this machine, configured as production runs one: a primary, two replicas and
three Sentinels (quorum 2), each a real process on a free port. ``make redis-ha`` runs one in the foreground.

Two replicas, not one: every data node refuses writes unless a replica acknowledges them
(``min-replicas-to-write 1``, so a primary cut off from the rest cannot take writes that a failover would
lose), and after a failover the promoted replica still has one replica of its own to acknowledge them.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from devstack.child import lifeline, stop_children_on_sigterm
from devstack.local import ROOT, free_port
from devstack.redis_server import RedisServer

SERVICE = "tts"
#: What every data node runs with on top of the single server's production settings.
MIN_REPLICAS = ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "5"]
#: A Sentinel takes the primary for down after this long without an answer, then the group fails over.
DOWN_AFTER_MS = 5000
FAILOVER_TIMEOUT_MS = 30000


class SentinelGroup:
    """A primary, ``replicas`` replicas and ``sentinels`` Sentinels in ``workdir``."""

    def __init__(self, workdir: Path, *, replicas: int = 2, sentinels: int = 3, service: str = SERVICE) -> None:
        self.workdir = workdir
        self.service = service
        self.nodes = [RedisServer(workdir / "node-0", MIN_REPLICAS)]
        primary = self.nodes[0].port
        for i in range(1, replicas + 1):
            replica_of = ["--replicaof", "127.0.0.1", str(primary)]
            self.nodes.append(RedisServer(workdir / f"node-{i}", [*MIN_REPLICAS, *replica_of]))
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.sentinels: dict[int, redis.Redis] = {}
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self._clients: dict[int, redis.Redis] = {}
        self.binary = self.nodes[0].binary

    def client(self, port: int) -> redis.Redis:
        """Return a client of the data node on ``port`` itself, not of whichever is primary (one per node, kept)."""
        if port not in self._clients:
            self._clients[port] = redis.Redis(port=port, socket_timeout=2)
        return self._clients[port]

    @property
    def url(self) -> str:
        """Return the group's URL, as REDIS_URL takes it."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def _sentinel_config(self, port: int) -> Path:
        folder = self.workdir / f"sentinel-{port}"
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "sentinel.conf"  # a Sentinel rewrites its own file: what it learns survives a restart
        config.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {folder}\nlogfile {folder / 'sentinel.log'}\n"
            f"sentinel monitor {self.service} 127.0.0.1 {self.nodes[0].port} 2\n"
            f"sentinel down-after-milliseconds {self.service} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {self.service} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {self.service} 1\n",
            encoding="utf-8",
        )
        return config

    def start(self, timeout: float = 30) -> None:
        """Start every node and Sentinel; return once the replicas are in sync and every Sentinel sees the rest."""
        stop_children_on_sigterm()
        for node in self.nodes:
            node.start()
        for port in self.sentinel_ports:
            command = [*lifeline(), self.binary, str(self._sentinel_config(port)), "--sentinel"]
            self._processes[port] = subprocess.Popen(command)
            self.sentinels[port] = redis.Redis(port=port, decode_responses=True, socket_timeout=2)
        deadline = time.monotonic() + timeout
        while not self.settled():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Sentinel group did not settle within {timeout:.0f} s; logs in {self.workdir}")
            time.sleep(0.1)

    def settled(self) -> bool:
        """Return whether every replica is in sync and every Sentinel knows the primary, replicas and others."""
        try:
            for node in self.nodes[1:]:
                info = self.client(node.port).info("replication")
                if info.get("master_link_status") != "up":
                    return False
            for client in self.sentinels.values():
                state = client.sentinel_master(self.service)
                assert isinstance(state, dict)
                if int(state["num-slaves"]) < len(self.nodes) - 1:
                    return False
                if int(state["num-other-sentinels"]) < len(self.sentinels) - 1:
                    return False
        except (redis.ConnectionError, redis.ResponseError, KeyError):
            return False
        return True

    def primary_port(self) -> int | None:
        """Return the port of the node the Sentinels name primary now (None if no Sentinel answers)."""
        for client in self.sentinels.values():
            with contextlib.suppress(redis.RedisError):
                found = client.sentinel_get_master_addr_by_name(self.service)
                if isinstance(found, tuple):
                    return int(found[1])
        return None

    def node(self, port: int) -> RedisServer:
        """Return the data node on ``port``."""
        return next(node for node in self.nodes if node.port == port)

    def primary(self) -> RedisServer:
        """Return the data node the Sentinels name primary now."""
        port = self.primary_port()
        if port is None:
            raise RuntimeError("no Sentinel names a primary")
        return self.node(port)

    def wait_new_primary(self, old: int, timeout: float = 60) -> float:
        """Wait until the Sentinels name a primary other than ``old`` that answers as one; return the seconds."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            port = self.primary_port()
            if port is not None and port != old:
                with contextlib.suppress(redis.RedisError):
                    if self.client(port).info("replication").get("role") == "master":
                        return time.monotonic() - started
            time.sleep(0.05)
        raise TimeoutError(f"no new primary within {timeout:.0f} s; logs in {self.workdir}")

    def kill_sentinel(self, port: int) -> None:
        """SIGKILL one Sentinel."""
        process = self._processes.get(port)
        if process is not None:
            process.kill()
            process.wait(10)
        self.sentinels.pop(port, None)

    def stop(self) -> None:
        """Stop every Sentinel and node (a frozen node is woken first, so that it can end)."""
        for port in list(self._processes):
            process = self._processes.pop(port)
            with contextlib.suppress(Exception):
                process.terminate()
                process.wait(10)
        for client in [*self.sentinels.values(), *self._clients.values()]:
            client.close()
        for node in self.nodes:
            node.resume()
            node.stop()


def main(argv: list[str]) -> int:
    """Run a group in the foreground until Ctrl-C, and print the REDIS_URL that reaches it."""
    parser = argparse.ArgumentParser(prog="make redis-ha", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", type=Path, default=ROOT / "var" / "redis-ha", help="where the nodes keep their data")
    args = parser.parse_args(argv)
    group = SentinelGroup(args.dir)
    group.start()
    print(f"==> a primary (port {group.nodes[0].port}), replicas on ports "
          f"{', '.join(str(n.port) for n in group.nodes[1:])} and Sentinels on ports "
          f"{', '.join(map(str, group.sentinel_ports))}; data and logs in {args.dir}")  # fmt: skip
    print(f"==> serve from it in another shell:  REDIS_URL='{group.url}' make run")
    print("==> Ctrl-C stops the group")
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        group.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
