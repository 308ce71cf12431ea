"""A Redis primary, a replica and a Sentinel on free loopback ports, for failover tests.

The replica reaches the primary through a small TCP relay in the test process, so a test can
cut replication (``cut_replication``): every write the primary acknowledges after the cut is
one the replica never gets, as with asynchronous replication when the primary dies before
its replica caught up. Killed at the end by pid, with their scratch directory.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import redis

from cli.devserver import free_port, redis_server_binary
from tests.conftest import wait_for

SERVICE = "leash-test"


class Relay:
    """Forwards loopback TCP connections to ``target_port``; ``cut()`` makes it drop what the
    target sends from then on (the connection stays open: a silent partition)."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut_event = threading.Event()
        self.closing = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                return
            upstream.settimeout(None)
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_target: bool) -> None:
        try:
            while data := source.recv(65536):
                if not (from_target and self.cut_event.is_set()):
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self.cut_event.set()

    def close(self) -> None:
        self.closing.set()
        for s in [self.listener, *self.sockets]:
            try:
                s.close()
            except OSError:
                pass


class SentinelSet:
    def __init__(self, down_after_ms: int = 1000, failover_timeout_ms: int = 5000):
        self.dir = Path(tempfile.mkdtemp(prefix="leash-test-sentinel-"))
        self.binary = redis_server_binary()
        self.procs: dict[str, subprocess.Popen] = {}
        self.primary_port = free_port()
        self.replica_port = free_port()
        self.sentinel_port = free_port()
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.relay: Relay | None = None

    def url(self, db: int = 0) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{SERVICE}/{db}"

    def _server(self, name: str, port: int, *extra: str) -> None:
        self.procs[name] = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(self.dir),
             "--dbfilename", f"{name}.rdb", "--save", "", "--appendonly", "no", "--loglevel", "warning",
             "--maxmemory-policy", "noeviction", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        client = redis.Redis(port=port, socket_timeout=1)
        wait_for(lambda: _answers(client), 10, message=f"{name} on port {port}")
        client.close()

    def start(self) -> SentinelSet:
        self._server("primary", self.primary_port)
        self.relay = Relay(self.primary_port)
        self._server("replica", self.replica_port, "--replicaof", "127.0.0.1", str(self.relay.port),
                     # the primary sees the relay's address; announce the replica's own
                     "--replica-announce-ip", "127.0.0.1", "--replica-announce-port", str(self.replica_port))
        replica = redis.Redis(port=self.replica_port)
        wait_for(lambda: replica.info("replication").get("master_link_status") == "up", 10,
                 message="the replica in sync")
        conf = self.dir / "sentinel.conf"
        conf.write_text(
            f"bind 127.0.0.1\nport {self.sentinel_port}\ndir {self.dir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
            f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}\n")
        self.procs["sentinel"] = subprocess.Popen(
            [self.binary, str(conf), "--sentinel", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        sentinel = redis.Redis(port=self.sentinel_port, socket_timeout=1)
        wait_for(lambda: self._sees_replica(sentinel), 15, message="the Sentinel sees the replica")
        return self

    def _sees_replica(self, sentinel: redis.Redis) -> bool:
        try:
            return any(r["port"] == self.replica_port for r in sentinel.sentinel_slaves(SERVICE))
        except redis.exceptions.RedisError:
            return False

    def primary_address(self) -> tuple[str, int] | None:
        """The primary as redis-py's Sentinel client finds it (SENTINEL MASTERS). During a
        switch SENTINEL GET-MASTER-ADDR-BY-NAME names the promoted replica earlier than that."""
        try:
            state = redis.Redis(port=self.sentinel_port, socket_timeout=1,
                                decode_responses=True).sentinel_masters()[SERVICE]
        except (redis.exceptions.RedisError, KeyError):
            return None
        return state["ip"], int(state["port"])

    def sentinel_failover(self) -> None:
        """A planned switch (SENTINEL FAILOVER): the replica becomes the primary and the old
        primary, still running, its replica."""
        sentinel = redis.Redis(port=self.sentinel_port, socket_timeout=5)

        def asked() -> bool:
            try:
                return bool(sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE))
            except redis.exceptions.ResponseError as exc:  # NOGOODSLAVE until it has seen the replica a while
                if "NOGOODSLAVE" not in str(exc):
                    raise
                return False

        wait_for(asked, 20, interval=0.5, message="the Sentinel accepting a failover")

    def cut_replication(self) -> None:
        assert self.relay is not None
        self.relay.cut()

    def kill_primary(self) -> None:
        proc = self.procs["primary"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def wait_promoted(self, timeout: float = 30) -> float:
        """Seconds until the Sentinel names the replica as the primary."""
        began = time.monotonic()
        wait_for(lambda: self.primary_address() == ("127.0.0.1", self.replica_port), timeout,
                 interval=0.1, message="the Sentinel promoting the replica")
        return time.monotonic() - began

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.relay is not None:
            self.relay.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.exceptions.RedisError:
        return False
