"""Web servers compared under slow clients and under ordinary load, on this machine, loopback only.

For each server setup: status reads by 32 concurrent clients for a few seconds (requests/s,
p50/p99), then 16 clients trickling a POST body and 200 trickling headers, a byte a second each,
while one client makes 20 ordinary status reads in a row (each may wait 5 s), then the server's
resident memory. ``leash web`` (waitress) is always measured; gunicorn's setups only when
gunicorn (and gevent for its worker) are installed: ``pip install gunicorn==27.0.1 gevent==26.9.0``.

    python benchmarks/bench_web_server.py            # figures in docs/BENCHMARKS.md ("Slow clients")
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import socket
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import Children, OwnRedis, free_port, wait_until  # noqa: E402

LOAD_SECONDS = 5
LOAD_CLIENTS = 32
SLOW_BODIES, SLOW_HEADERS = 16, 200
PROBES = 20
PROBE_TIMEOUT = 5.0
TRICKLE_SECONDS = 30  # at most; the probes end it sooner


def setups(port: int) -> dict[str, list[str]]:
    py = sys.executable
    found = {"leash web (waitress, 1 process x 16 threads)": [py, "-m", "cli", "web", "--host", "127.0.0.1",
                                                               "--port", str(port)]}
    gunicorn = [py, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--log-level", "error"]
    if importlib.util.find_spec("gunicorn"):
        found["gunicorn gthread, 2 processes x 8 threads (before)"] = gunicorn + [
            "--worker-class", "gthread", "--threads", "8", "--workers", "2", "web.app:create_app()"]
        if importlib.util.find_spec("gevent"):
            found["gunicorn gevent, 2 processes x 1000 connections"] = gunicorn + [
                "--worker-class", "gevent", "--worker-connections", "1000", "--workers", "2", "web.app:create_app()"]
    return found


def _get(port: int, path: str, timeout: float = 10) -> tuple[int, float]:
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path, headers={"Accept": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    finally:
        connection.close()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def load(port: int, path: str) -> dict:
    deadline = time.monotonic() + LOAD_SECONDS
    took: list[float] = []
    errors = [0]

    def client(_):
        while time.monotonic() < deadline:
            try:
                status, seconds = _get(port, path)
            except OSError:
                errors[0] += 1
                continue
            if status == 200:
                took.append(seconds)
            else:
                errors[0] += 1

    with ThreadPoolExecutor(max_workers=LOAD_CLIENTS) as pool:
        list(pool.map(client, range(LOAD_CLIENTS)))
    return {"rps": len(took) / LOAD_SECONDS, "p50": statistics.median(took), "p99": _quantile(took, 0.99),
            "errors": errors[0]}


def slow_clients(port: int, path: str) -> dict:
    sockets = []
    stop = threading.Event()
    for n in range(SLOW_BODIES + SLOW_HEADERS):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if n < SLOW_BODIES:
            sock.sendall(b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000\r\n\r\n")
        else:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        sockets.append(sock)

    def trickle():
        deadline = time.monotonic() + TRICKLE_SECONDS
        while not stop.is_set() and time.monotonic() < deadline:
            for n, sock in enumerate(sockets):
                try:
                    sock.send(b" " if n < SLOW_BODIES else b"X")
                except OSError:
                    pass
            stop.wait(1.0)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        time.sleep(3)  # the trickle under way: every thread that would take a slow client has
        took, failed = [], 0
        for _ in range(PROBES):
            try:
                status, seconds = _get(port, path, timeout=PROBE_TIMEOUT)
                took.append(seconds if status == 200 else PROBE_TIMEOUT)
                failed += status != 200
            except OSError:
                took.append(PROBE_TIMEOUT)
                failed += 1
    finally:
        stop.set()
        thread.join(timeout=10)
        for sock in sockets:
            sock.close()
    return {"p50": statistics.median(took), "max": max(took), "failed": failed}


def rss_mb(pid: int) -> float:
    process = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]) / 2**20


def main() -> None:
    redis_server = OwnRedis().start()
    children = Children()
    rows = []
    try:
        port = free_port()
        for name, argv in setups(port).items():  # one at a time, each on the same port
            # The slow clients stand for many addresses (all loopback here): no per-address cap.
            env = dict(os.environ, REDIS_URL=redis_server.url, SECRET_KEY="bench", LEASH_API_TOKENS="",
                       LEASH_WEB_CONNECTIONS_PER_ADDRESS="0")
            env.pop("PROMETHEUS_MULTIPROC_DIR", None)
            server = children.start(argv, env, stderr=open(os.devnull, "wb"))  # noqa: SIM115 - the child owns it

            def answers():
                try:
                    return _get(port, "/healthz", timeout=1)[0] == 200
                except OSError:
                    return False

            if not wait_until(answers, 30):
                raise SystemExit(f"{name} did not start")
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            connection.request("POST", "/jobs", body=json.dumps({"kind": "classify", "items": ["a"],
                                                                 "labels": ["x", "y"]}),
                               headers={"Content-Type": "application/json"})
            path = f"/jobs/{json.loads(connection.getresponse().read())['job_id']}"
            connection.close()
            ordinary = load(port, path)
            slow = slow_clients(port, path)
            rows.append((name, ordinary, slow, rss_mb(server.pid)))
            children.signal_tree(server, 9)
            server.wait(timeout=10)
    finally:
        children.cleanup()
        redis_server.stop()
    print(f"\n| server | {LOAD_CLIENTS} clients: requests/s, p50 / p99 | {SLOW_BODIES + SLOW_HEADERS} slow clients: "
          f"{PROBES} ordinary reads p50 / max (failed) | RSS |")
    print("|---|---|---|---:|")
    for name, ordinary, slow, rss in rows:
        print(f"| {name} | {ordinary['rps']:,.0f}/s, {ordinary['p50'] * 1000:.0f} / {ordinary['p99'] * 1000:.0f} ms"
              f"{' (' + str(ordinary['errors']) + ' errors)' if ordinary['errors'] else ''} | "
              f"{slow['p50'] * 1000:,.0f} / {slow['max'] * 1000:,.0f} ms ({slow['failed']} of {PROBES}) | "
              f"{rss:.0f} MB |")


if __name__ == "__main__":
    main()
