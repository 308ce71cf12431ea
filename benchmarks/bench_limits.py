#!/usr/bin/env python3
"""What one request can cost, measured.

    python benchmarks/bench_limits.py                 # both parts
    python benchmarks/bench_limits.py --part storage  # Redis bytes per request byte at the limits
    python benchmarks/bench_limits.py --part stall    # 503 latencies while Redis is stalled
    python benchmarks/bench_limits.py --part submitters  # 64 concurrent submitters against a queued cap of 20

Storage: the largest classify and prompt requests the default limits allow (1,000 items filling
LEASH_MAX_PAYLOAD_BYTES; the widest labels; the longest template), posted to the app and run
to the end by a real worker on the offline backend; then the job hash, the status answer and
every byte Redis holds (MEMORY USAGE of each key) against the request's size.

Stall: the web process as the Procfile runs it (``leash web``, LEASH_REDIS_TIMEOUT=5), Redis
stopped with SIGSTOP (it accepts connections and answers nothing); one request meets the stall,
then 32 concurrent status reads; then the time from SIGCONT until ten answers in a row are 200.
Ten runs in a row, each reported. Also measured in the same run: the server before (gunicorn,
two processes, each learning of the stall on its own; when gunicorn is installed) and, as the
baseline, the client the app used before the breaker (each request waits its own timeout).

Submitters: 64 submissions released together (a barrier) against LEASH_MAX_QUEUED_PER_OWNER=20,
ten runs in a row, each from an empty Redis: through ``leash web`` (64 HTTP clients, one POST
/jobs each) and through ``jobs.enqueue`` in this process (64 threads over 8 connection pools);
accepted and queued against the cap, each run reported.

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
import time
from concurrent.futures import ThreadPoolExecutor

try:
    from benchlib import ROOT, Children, OwnRedis, wait_until
except ImportError:  # imported by the server as benchmarks.bench_limits (the baseline app)
    from benchmarks.benchlib import ROOT, Children, OwnRedis, wait_until

CONCURRENT = 32
REDIS_TIMEOUT = "5"


def unguarded_app():
    """The app with the Redis client it had before the breaker (the stall baseline)."""
    from jobs.core.store.connection import connect
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


RUNS = 10


def _stall_runs(redis_server: OwnRedis, children: Children, argv: list[str], port: int) -> list[dict]:
    env = dict(os.environ, REDIS_URL=redis_server.url, LEASH_REDIS_TIMEOUT=REDIS_TIMEOUT, SECRET_KEY="bench",
               LEASH_API_TOKENS="")
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    server = children.start(argv, env, stderr=open(os.devnull, "wb"))  # noqa: SIM115 - the child owns it

    def answers():
        try:
            return _request(port, "/healthz")[0] == 200
        except OSError:
            return False

    if not wait_until(answers, 30):
        raise SystemExit(f"{argv} did not start")
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", "/jobs", body=json.dumps({"kind": "classify", "items": ["a"], "labels": ["x", "y"]}),
                       headers={"Content-Type": "application/json"})
    path = f"/jobs/{json.loads(connection.getresponse().read())['job_id']}"
    connection.close()
    _burst(port, path, CONCURRENT)  # every pool warm
    runs = []
    for _ in range(RUNS):
        os.kill(redis_server.proc.pid, signal.SIGSTOP)
        try:
            met = _burst(port, path, 1)[0]  # one request meets the stall
            known = _burst(port, path, CONCURRENT)
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        resumed = time.monotonic()
        wait_until(lambda: all(status == 200 for status, _ in _burst(port, path, 10)), 60)  # noqa: B023
        runs.append({"met": met, "known": known, "recovery": time.monotonic() - resumed})
    children.signal_tree(server, signal.SIGKILL)
    server.wait(timeout=30)
    return runs


def stall(redis_server: OwnRedis, children: Children) -> None:
    import importlib.util

    from cli.devserver import free_port

    timeout = float(REDIS_TIMEOUT)
    print(f"\n## Stall: Redis stopped (SIGSTOP), one request meets it, then {CONCURRENT} concurrent status reads; "
          f"{RUNS} runs in a row, LEASH_REDIS_TIMEOUT={REDIS_TIMEOUT}\n")
    print(f"| server | the request that met it (median) | {CONCURRENT} reads: p50 per run, min / median / max | "
          f"p99 per run, max | runs with p50 < 100 ms and p99 <= {timeout + 1:g} s | statuses | "
          "recovery after SIGCONT, median / max |")
    print("|---|---:|---|---:|---:|---|---|")
    port = free_port()
    py = sys.executable
    setups = {"leash web (waitress, 1 process x 16 threads), fail fast":
              [py, "-m", "cli", "web", "--host", "127.0.0.1", "--port", str(port)]}
    if importlib.util.find_spec("gunicorn"):  # the server before: pip install gunicorn==27.0.1
        setups["before: gunicorn gthread 2 processes x 8 threads, fail fast per process"] = [
            py, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--worker-class", "gthread", "--threads", "8",
            "--workers", "2", "--log-level", "error", "web.app:create_app()"]
    setups["baseline: waitress 1 x 16, a timeout per request"] = [
        py, "-m", "waitress", f"--listen=127.0.0.1:{port}", "--threads=16", "--call",
        "benchmarks.bench_limits:unguarded_app"]
    for name, argv in setups.items():
        runs = _stall_runs(redis_server, children, argv, port)
        p50s = [statistics.median(t for _, t in run["known"]) for run in runs]
        p99s = [_quantile([t for _, t in run["known"]], 0.99) for run in runs]
        good = sum(p50 < 0.1 and p99 <= timeout + 1 for p50, p99 in zip(p50s, p99s, strict=True))
        statuses = sorted({status for run in runs for status, _ in [run["met"], *run["known"]]})
        recoveries = [run["recovery"] * 1000 for run in runs]
        print(f"| {name} | {statistics.median(run['met'][1] for run in runs) * 1000:,.0f} ms | "
              f"{min(p50s) * 1000:,.0f} / {statistics.median(p50s) * 1000:,.0f} / {max(p50s) * 1000:,.0f} ms | "
              f"{max(p99s) * 1000:,.0f} ms | {good} of {RUNS} | {statuses} | "
              f"{statistics.median(recoveries):,.0f} / {max(recoveries):,.0f} ms |")


# --- submitters ----------------------------------------------------------------------------

SUBMITTERS = 64
CAP = 20


def _together(count: int, submit) -> list:
    """``submit(i)`` on ``count`` threads released at once; each answer or exception."""
    import threading

    barrier = threading.Barrier(count)

    def one(i: int):
        barrier.wait(timeout=60)
        try:
            return submit(i)
        except Exception as exc:  # a refusal (QueueFull) or anything else: counted as not accepted
            return exc

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(one, range(count)))


def _post_job(port: int) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/jobs", body=json.dumps({"kind": "classify", "items": ["a"], "labels": ["x", "y"]}),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def submitters(redis_server: OwnRedis, children: Children) -> None:
    import redis

    from cli.devserver import free_port
    from jobs import keys

    print(f"\n## Submitters: {SUBMITTERS} at once against LEASH_MAX_QUEUED_PER_OWNER={CAP}, {RUNS} runs\n")
    print("| path | accepted per run | queued per run | runs with exactly the cap |")
    print("|---|---|---|---:|")
    client = redis_server.client()
    port = free_port()
    env = dict(os.environ, REDIS_URL=redis_server.url, SECRET_KEY="bench", LEASH_API_TOKENS="",
               LEASH_MAX_QUEUED_PER_OWNER=str(CAP))
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    server = children.start([sys.executable, "-m", "cli", "web", "--host", "127.0.0.1", "--port", str(port)], env,
                            stderr=open(os.devnull, "wb"))  # noqa: SIM115 - the child owns it

    def answers():
        try:
            return _request(port, "/healthz")[0] == 200
        except OSError:
            return False

    if not wait_until(answers, 30):
        raise SystemExit("leash web did not start")
    results = {}
    api = []
    for _ in range(RUNS):
        client.flushdb()
        statuses = _together(SUBMITTERS, lambda i: _post_job(port))
        api.append((statuses.count(202), client.zcard(keys.owner_state("shared", "queued"))))
    results["API: leash web, POST /jobs"] = api
    children.signal_tree(server, signal.SIGKILL)
    server.wait(timeout=30)

    os.environ.update(REDIS_URL=redis_server.url, LEASH_MAX_QUEUED_PER_OWNER=str(CAP))
    from jobs.enqueue import enqueue

    pools = [redis.Redis.from_url(redis_server.url) for _ in range(8)]
    direct = []
    for _ in range(RUNS):
        client.flushdb()
        answers_ = _together(SUBMITTERS, lambda i: enqueue(pools[i % 8], "classify", {"items": ["a"],
                                                                                      "labels": ["x", "y"]},
                                                           owner="bench"))
        direct.append((sum(isinstance(a, tuple) for a in answers_), client.zcard(keys.owner_state("bench", "queued"))))
    results["Python: jobs.enqueue, 64 threads"] = direct
    for name, runs in results.items():
        print(f"| {name} | {', '.join(str(a) for a, _ in runs)} | {', '.join(str(q) for _, q in runs)} | "
              f"{sum(a == q == CAP for a, q in runs)} of {RUNS} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["storage", "stall", "submitters", "all"], default="all")
    args = parser.parse_args()
    os.chdir(ROOT)  # the servers import the app from here
    redis_server = OwnRedis().start()
    children = Children()
    try:
        if args.part in ("storage", "all"):
            storage(redis_server, children)
        if args.part in ("stall", "all"):
            stall(redis_server, children)
        if args.part in ("submitters", "all"):
            submitters(redis_server, children)
    finally:
        children.cleanup()
        redis_server.close()


if __name__ == "__main__":
    main()
