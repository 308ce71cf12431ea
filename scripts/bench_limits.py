#!/usr/bin/env python3
"""What one request can cost, measured.

    python scripts/bench_limits.py                 # both parts
    python scripts/bench_limits.py --part storage  # Redis bytes per request byte at the limits
    python scripts/bench_limits.py --part stall    # 503 latencies while Redis is stalled

Storage: the largest classify and prompt requests the default limits allow (1,000 items filling
LEASH_MAX_PAYLOAD_BYTES; the widest labels; the longest template), posted to the app and run
to the end by a real worker on the offline backend; then the job hash, the status answer and
every byte Redis holds (MEMORY USAGE of each key) against the request's size.

Stall: gunicorn as the Procfile runs it (2 workers x 8 threads, LEASH_REDIS_TIMEOUT=5), Redis
stopped with SIGSTOP for 15 s (it accepts connections and answers nothing). 32 concurrent
status requests at the start of the stall, 32 more 6.5 s in (once the stall is known), then
the time from SIGCONT until ten answers in a row are 200. Measured twice in the same run: with
the fail-fast breaker (web.redis_guard) and, as the baseline, with the client the app used
before it (each request waits its own timeout, redis-py's default retries included).

Everything runs on a Redis of its own on a free loopback port; nothing else is touched.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

try:
    from benchlib import ROOT, Children, OwnRedis, wait_until
except ImportError:  # imported by gunicorn as scripts.bench_limits (the baseline app)
    from scripts.benchlib import ROOT, Children, OwnRedis, wait_until

STALL_SECONDS = 15.0
KNOWN_AT = 6.5
CONCURRENT = 32
REDIS_TIMEOUT = "5"


def unguarded_app():
    """The app with the Redis client it had before the breaker (the stall baseline)."""
    from jobs.connection import connect
    from web.app import create_app

    app = create_app()
    app.extensions["leash_redis"] = connect(app.config["REDIS_URL"], socket_timeout=app.config["LEASH_REDIS_TIMEOUT"])
    return app


# --- storage -------------------------------------------------------------------------------

def _words(rng: random.Random, chars: int) -> str:
    words, length = [], 0
    while length < chars:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:chars]


def _largest(fields: dict, rng: random.Random) -> bytes:
    from jobs.config import limits

    limit = limits()
    frame = len(json.dumps({**fields, "items": [""] * limit.max_items}))
    per_item = min(limit.max_item_chars, (limit.max_payload_bytes - frame - 100) // limit.max_items)
    return json.dumps({**fields, "items": [_words(rng, per_item) for _ in range(limit.max_items)]}).encode()


def _stored(client) -> int:
    return sum(client.memory_usage(key, samples=0) or 0 for key in client.scan_iter(count=1000))


def storage(redis_server: OwnRedis, children: Children) -> None:
    from jobs import keys
    from jobs.config import limits
    from web.app import create_app

    limit = limits()
    labels = [f"{i:02d}" + "x" * (limit.max_label_chars - 2) for i in range(limit.max_labels)]
    cases = {
        "classify, 2 short items (typical)": json.dumps({"kind": "classify", "items": ["good film", "bad film"],
                                                         "labels": ["positive", "negative"]}).encode(),
        "classify at the limits": _largest({"kind": "classify", "labels": labels}, random.Random(1)),
        "prompt at the limits": _largest({"kind": "prompt", "template": "{item}" + "t" * (limit.max_template_chars - 6)},
                                         random.Random(2)),
        "before the limits: one 100 KB label, 1,000 items": json.dumps(
            {"kind": "classify", "items": ["x"] * 1000, "labels": ["y" * 100_000, "z"]}).encode(),
    }
    app = create_app({"REDIS_URL": redis_server.url, "SECRET_KEY": "bench", "LEASH_API_TOKENS": ""})
    web = app.test_client()
    conn = redis_server.client()
    children.start([sys.executable, "-m", "cli", "worker", "--no-scheduler", "--log-level", "WARNING"],
                   dict(os.environ, REDIS_URL=redis_server.url, LEASH_LOCAL_DELAY_MS="0"))
    print("\n## Storage: what an accepted request leaves in Redis\n")
    print("| request | request bytes | answer | job hash bytes (MEMORY USAGE) | status answer bytes | "
          "Redis bytes stored | stored / request |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for name, body in cases.items():
        conn.flushdb()
        before = _stored(conn)
        response = web.post("/jobs", data=body, headers={"Content-Type": "application/json"})
        if response.status_code != 202:
            print(f"| {name} | {len(body):,} | {response.status_code}: {response.get_json()['error'][:60]}... "
                  "| | | | |")
            continue
        job_id = response.get_json()["job_id"]
        wait_until(lambda: conn.hget(keys.job(job_id), "state") in (b"succeeded", b"failed"), 120)  # noqa: B023
        stored = _stored(conn) - before
        job_hash = sum(len(k) + len(v) for k, v in conn.hgetall(keys.job(job_id)).items())
        status = web.get(f"/jobs/{job_id}")
        print(f"| {name} | {len(body):,} | 202, {status.get_json()['state']} | {job_hash:,} "
              f"({conn.memory_usage(keys.job(job_id), samples=0):,}) | {len(status.data):,} | {stored:,} | "
              f"{stored / len(body):.2f} |")


# --- stall ---------------------------------------------------------------------------------

def _request(port: int, path: str) -> tuple[int, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    started = time.monotonic()
    try:
        connection.request("GET", path, headers={"Accept": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    finally:
        connection.close()


def _burst(port: int, path: str, count: int) -> list[tuple[int, float]]:
    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(lambda _: _request(port, path), range(count)))


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _stall_round(redis_server: OwnRedis, children: Children, app_spec: str) -> dict:
    from cli.devserver import free_port

    port = free_port()
    env = dict(os.environ, REDIS_URL=redis_server.url, LEASH_REDIS_TIMEOUT=REDIS_TIMEOUT, SECRET_KEY="bench",
               LEASH_API_TOKENS="")
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    server = children.start([sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--worker-class",
                             "gthread", "--threads", "8", "--workers", "2", "--log-level", "error", app_spec],
                            env, stderr=open(os.devnull, "wb"))  # noqa: SIM115 - the child owns it

    def answers():
        try:
            return _request(port, "/healthz")[0] == 200
        except OSError:
            return False

    if not wait_until(answers, 30):
        raise SystemExit("gunicorn did not start")
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", "/jobs", body=json.dumps({"kind": "classify", "items": ["a"], "labels": ["x", "y"]}),
                       headers={"Content-Type": "application/json"})
    path = f"/jobs/{json.loads(connection.getresponse().read())['job_id']}"
    connection.close()
    _burst(port, path, CONCURRENT)  # every worker's pool warm

    results: dict[str, list] = {}
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    stalled = time.monotonic()
    try:
        first = threading.Thread(target=lambda: results.__setitem__("first", _burst(port, path, CONCURRENT)))
        first.start()
        time.sleep(KNOWN_AT)
        known = threading.Thread(target=lambda: results.__setitem__("known", _burst(port, path, CONCURRENT)))
        known.start()
        time.sleep(max(0.0, STALL_SECONDS - (time.monotonic() - stalled)))
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    resumed = time.monotonic()
    wait_until(lambda: all(status == 200 for status, _ in _burst(port, path, 10)), 60)
    recovery = time.monotonic() - resumed
    first.join()
    known.join()
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=30)
    return {"first": results["first"], "known": results["known"], "recovery": recovery}


def stall(redis_server: OwnRedis, children: Children) -> None:
    print(f"\n## Stall: {CONCURRENT} concurrent status requests, Redis stopped {STALL_SECONDS:g} s, "
          f"LEASH_REDIS_TIMEOUT={REDIS_TIMEOUT}\n")
    print("| client | at the stall: p50 / p99 / max | once known (+6.5 s): p50 / p99 / max | statuses | "
          "recovery after SIGCONT |")
    print("|---|---|---|---|---:|")
    rounds = {"fail fast (web.redis_guard)": "web.app:create_app()",
              "baseline: a timeout per request": "scripts.bench_limits:unguarded_app()"}
    for name, spec in rounds.items():
        measured = _stall_round(redis_server, children, spec)

        def show(burst):
            took = [t * 1000 for _, t in burst]
            return f"{statistics.median(took):,.0f} / {_quantile(took, 0.99):,.0f} / {max(took):,.0f} ms"

        statuses = sorted({status for status, _ in measured["first"] + measured["known"]})
        print(f"| {name} | {show(measured['first'])} | {show(measured['known'])} | {statuses} | "
              f"{measured['recovery'] * 1000:,.0f} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["storage", "stall", "all"], default="all")
    args = parser.parse_args()
    os.chdir(ROOT)  # gunicorn reads gunicorn.conf.py from the working directory
    redis_server = OwnRedis().start()
    children = Children()
    try:
        if args.part in ("storage", "all"):
            storage(redis_server, children)
        if args.part in ("stall", "all"):
            stall(redis_server, children)
    finally:
        children.cleanup()
        redis_server.close()


if __name__ == "__main__":
    main()
