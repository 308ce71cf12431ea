"""One address holding N trickling connections against ``leash web``, loopback only.

An attacker on 127.0.0.1 keeps N sockets open, each sending one byte of a never-ending request
every 10 s, and reopens any the server closes (as a real one would). Meanwhile an ordinary
client on 127.0.0.2 reads a job's status every 0.2 s. Printed: the ordinary reads' latency
(p50 / p99 / max) and failures, and what the attacker saw (sockets open at the end, 429s, closes).

Two setups: ``before`` emulates the server without the per-address cap or request deadline
(LEASH_WEB_CONNECTIONS=1000, LEASH_WEB_CONNECTIONS_PER_ADDRESS=0, a deadline longer than the
run); ``after`` is ``leash web`` with its defaults.

    python benchmarks/bench_held_connections.py --connections 3000 --seconds 45
    python benchmarks/bench_held_connections.py --connections 3000 --setup after
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import Children, OwnRedis, free_port, wait_until  # noqa: E402

BYTE_EVERY = 10.0
PROBE_EVERY = 0.2
PROBE_TIMEOUT = 10.0
SETUPS = {
    "before": {"LEASH_WEB_CONNECTIONS": "1000", "LEASH_WEB_CONNECTIONS_PER_ADDRESS": "0",
               "LEASH_WEB_REQUEST_DEADLINE": "100000"},
    "after": {},
}


class Attacker:
    """N sockets from 127.0.0.1, each trickling a request a byte every BYTE_EVERY seconds."""

    def __init__(self, port: int, connections: int):
        self.port, self.connections = port, connections
        self.sockets: list[socket.socket | None] = [None] * connections
        self.stop = threading.Event()
        self.refused = self.closed = self.opened = 0

    def _open(self) -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=2, source_address=("127.0.0.1", 0))
            sock.sendall(b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
            sock.setblocking(False)
            self.opened += 1
            return sock
        except OSError:
            return None

    def _poke(self, n: int) -> None:
        sock = self.sockets[n]
        if sock is not None:
            try:
                answer = sock.recv(4096)  # an answer (a 429) or the end: the server is done with it
                self.refused += answer.startswith(b"HTTP/1.1 429")
                self.closed += 1
                sock.close()
                sock = None
            except BlockingIOError:
                try:
                    sock.send(b"x")
                except OSError:
                    self.closed += 1
                    sock.close()
                    sock = None
            except OSError:
                self.closed += 1
                sock.close()
                sock = None
        self.sockets[n] = sock if sock is not None else self._open()

    def run(self) -> None:
        for n in range(self.connections):  # open them all first, as fast as the server accepts
            if self.stop.is_set():
                return
            self.sockets[n] = self._open()
        while not self.stop.is_set():
            tick = time.monotonic()
            for n in range(self.connections):
                if self.stop.is_set():
                    return
                self._poke(n)
                # spread one round over BYTE_EVERY seconds
                behind = tick + BYTE_EVERY * (n + 1) / self.connections - time.monotonic()
                if behind > 0:
                    time.sleep(behind)

    def open_now(self) -> int:
        return sum(sock is not None for sock in self.sockets)

    def close_all(self) -> None:
        for sock in self.sockets:
            if sock is not None:
                sock.close()


def _read(port: int, path: str) -> tuple[int, float]:
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT, source_address=("127.0.0.2", 0))
    try:
        connection.request("GET", path, headers={"Accept": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    except OSError:
        return 0, time.monotonic() - started
    finally:
        connection.close()


def measure(setup: str, connections: int, seconds: float, redis_url: str, children: Children) -> dict:
    port = free_port()
    env = dict(os.environ, REDIS_URL=redis_url, SECRET_KEY="bench", LEASH_API_TOKENS="", **SETUPS[setup])
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    server = children.start([sys.executable, "-m", "cli", "web", "--host", "127.0.0.1", "--port", str(port)], env,
                            stderr=open(os.devnull, "wb"))  # noqa: SIM115 - the child owns it
    try:
        if not wait_until(lambda: _read(port, "/healthz")[0] == 200, 30):
            raise SystemExit(f"{setup}: the server did not start")
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("POST", "/jobs", body=json.dumps({"kind": "classify", "items": ["a"], "labels": ["x", "y"]}),
                           headers={"Content-Type": "application/json"})
        path = f"/jobs/{json.loads(connection.getresponse().read())['job_id']}"
        connection.close()
        attacker = Attacker(port, connections)
        thread = threading.Thread(target=attacker.run, daemon=True)
        thread.start()
        latencies, failed = [], 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            status, took = _read(port, path)
            if status == 200:
                latencies.append(took)
            else:
                failed += 1
            time.sleep(PROBE_EVERY)
        result = {"setup": setup, "reads": len(latencies) + failed, "failed": failed,
                  "held_at_end": attacker.open_now(), "opened": attacker.opened, "refused_429": attacker.refused,
                  "closed_by_server": attacker.closed}
        attacker.stop.set()
        thread.join(timeout=30)
        attacker.close_all()
        if latencies:
            latencies.sort()
            result.update(p50=statistics.median(latencies), p99=latencies[int(0.99 * (len(latencies) - 1))],
                          max=latencies[-1])
        return result
    finally:
        children.signal_tree(server, 9)
        server.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--setup", choices=["before", "after", "both"], default="both")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attacker's sockets
    redis_server = OwnRedis().start()
    children = Children()
    rows = []
    try:
        for setup in (["before", "after"] if args.setup == "both" else [args.setup]):
            rows.append(measure(setup, args.connections, args.seconds, redis_server.url, children))
    finally:
        children.cleanup()
        redis_server.stop()
    print(f"\n{args.connections} trickling connections from 127.0.0.1 for {args.seconds:.0f} s; "
          "ordinary reads from 127.0.0.2 every 0.2 s")
    print("| setup | ordinary reads | p50 / p99 / max | failed | attacker: held at end, opened, 429s, closed |")
    print("|---|---:|---|---:|---|")
    for row in rows:
        timing = (f"{row['p50'] * 1000:,.0f} / {row['p99'] * 1000:,.0f} / {row['max'] * 1000:,.0f} ms"
                  if "p50" in row else "none answered")
        print(f"| {row['setup']} | {row['reads']} | {timing} | {row['failed']} | {row['held_at_end']}, "
              f"{row['opened']}, {row['refused_429']}, {row['closed_by_server']} |")


if __name__ == "__main__":
    main()
