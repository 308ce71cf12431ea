"""A batch as fast as the model and the account allow: leash's items at once, measured.

    python benchmarks/bench_items.py [--only sweep,anchor,rpm,storm,kill] [--items 120] [--latency 0.5]

Every figure is against a baseline measured in the same run, over the loopback
OpenAI-compatible server of the tests (tests/fake_openai.py, so '.[test]' must be installed)
answering each call after ``--latency`` seconds; leash's side is a real ``leash worker`` on a
Redis of this script's own.

  sweep   one 120-item ``prompt`` job at LEASH_ITEM_CONCURRENCY 1, 4, 16, 64: wall time (the
          job's started_at to ended_at) against one call at a time (concurrency 1) and against
          the physical limit items x latency / concurrency; the work-horse's peak RSS.
  anchor  what users write instead, as a process of its own over the same server: asyncio +
          a semaphore around ``AsyncOpenAI``, and a thread pool around ``OpenAI``; items/s,
          CPU seconds and peak RSS, against leash at the same concurrency (480 items).
  rpm     LEASH_MODEL_RPM=600, two workers, two jobs x 200 items: requests per minute the
          server saw, overall and over every 10 s window.
  storm   the server takes 8 calls at once and answers 429 (Retry-After: 1) beyond; leash
          starts at 16: 429s as a share of calls, throughput against the server's capacity
          (8 / latency), where the shared limit settled.
  kill    SIGKILL of worker and work-horse mid-job at concurrency 16; another worker finishes:
          every item stored once, calls redone.

Prints a table per part and one JSON line at the end. Every process it starts is killed by pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import psutil
from benchlib import ROOT, Children, OwnRedis, wait_until, worker_env

from jobs import keys
from jobs.enqueue import enqueue
from tests.fake_openai import MODEL, FakeOpenAI

PARTS = ("sweep", "anchor", "rpm", "storm", "kill")


class Bench:
    def __init__(self, args):
        self.args = args
        self.redis = OwnRedis().start()
        self.conn = self.redis.client()
        self.children = Children()
        self.server: FakeOpenAI | None = None

    def fresh(self, **server_options) -> FakeOpenAI:
        """A new model server and an empty Redis (the shared limits start over)."""
        self.children.cleanup()
        self.children = Children()
        if self.server is not None:
            self.server.stop()
        self.conn.flushdb()
        self.server = FakeOpenAI(latency=self.args.latency, **server_options).start()
        return self.server

    def worker(self, log_path: str | None = None, **env: str):
        settings = dict(LEASH_MODEL_URL=self.server.url, LEASH_MODEL_NAME=MODEL, LEASH_MODEL_API_KEY="bench",
                        LEASH_MODEL_TIMEOUT="30", LEASH_LEASE_SECONDS="5", LEASH_RETRY_BACKOFF="0")
        settings.update(env)
        level = "INFO" if log_path else "WARNING"
        stderr = open(log_path, "w") if log_path else None  # noqa: SIM115 (the child writes it)
        return self.children.start(
            [sys.executable, "-m", "cli", "worker", "--no-scheduler", "--log-level", level],
            worker_env(self.redis.url, **settings), stderr=stderr)

    def job(self, n: int, owner: str = "bench", prefix: str = "item") -> tuple[str, list[str]]:
        items = [f"{prefix}-{i}" for i in range(n)]
        job_id, _ = enqueue(self.conn, "prompt", {"items": items, "template": "{item}"}, owner=owner)
        return job_id, items

    def wait_ended(self, job_id: str, timeout: float) -> dict:
        def ended():
            fields = self.conn.hgetall(keys.job(job_id))
            return fields if fields.get(b"state") in (b"succeeded", b"failed") else None

        fields = wait_until(ended, timeout, interval=0.05)
        if fields is None:
            raise SystemExit(f"job {job_id} did not end within {timeout:.0f}s")
        if fields[b"state"] != b"succeeded":
            raise SystemExit(f"job {job_id} failed: {fields.get(b'error', b'').decode()[:500]}")
        return {k.decode(): v.decode() for k, v in fields.items()}

    def close(self):
        self.children.cleanup()
        if self.server is not None:
            self.server.stop()
        self.redis.close()


class PeakRss:
    """Samples the RSS of a worker's work-horse (its child) until stopped."""

    def __init__(self, worker_pid: int):
        self.worker_pid = worker_pid
        self.peak = 0
        self.threads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.wait(0.05):
            try:
                for horse in psutil.Process(self.worker_pid).children():
                    self.peak = max(self.peak, horse.memory_info().rss)
                    self.threads = max(self.threads, horse.num_threads())
            except psutil.Error:
                pass


# --- sweep ---------------------------------------------------------------------------------

def sweep(bench: Bench, results: dict) -> None:
    n, latency = bench.args.items, bench.args.latency
    rows = []
    for concurrency in (1, 4, 16, 64):
        server = bench.fresh()
        worker = bench.worker(LEASH_ITEM_CONCURRENCY=str(concurrency))
        time.sleep(1.0)  # the worker is up and idle before the job arrives
        with PeakRss(worker.pid) as rss:
            job_id, _ = bench.job(n)
            fields = bench.wait_ended(job_id, timeout=n * latency * 2 + 60)
        wall = float(fields["ended_at"]) - float(fields["started_at"])
        rows.append({"concurrency": concurrency, "wall_s": round(wall, 2),
                     "limit_s": round(n * latency / concurrency, 2), "max_in_flight": server.max_in_flight,
                     "horse_peak_rss_mb": round(rss.peak / 2**20, 1), "horse_threads": rss.threads})
    one = rows[0]["wall_s"]
    print(f"\n## sweep: one job of {n} items x {latency} s, one worker")
    print("| concurrency | wall | vs one at a time | physical limit | of the limit | most in flight | horse peak RSS |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        row["speedup"] = round(one / row["wall_s"], 2)
        row["of_limit"] = round(row["limit_s"] / row["wall_s"], 3)
        print(f"| {row['concurrency']} | {row['wall_s']:.2f} s | {row['speedup']:.2f}x | {row['limit_s']:.2f} s "
              f"| {row['of_limit']:.0%} | {row['max_in_flight']} | {row['horse_peak_rss_mb']} MB "
              f"({row['horse_threads']} threads) |")
    by = {row["concurrency"]: row for row in rows}
    ratio = by[16]["horse_peak_rss_mb"] / by[1]["horse_peak_rss_mb"]
    print(f"memory: horse peak RSS at concurrency 16 / 1 = {ratio:.2f}x (goal <= 1.5x)")
    print(f"speed: concurrency 16 = {by[16]['speedup']:.2f}x one at a time (goal >= 12x, limit 16x)")
    results["sweep"] = {"rows": rows, "rss_ratio_16_vs_1": round(ratio, 2)}


# --- anchor --------------------------------------------------------------------------------

def anchor_main(mode: str, url: str, n: int, concurrency: int) -> None:
    """Runs in a process of its own: what a user would write instead of a queue."""
    items = [f"anchor-{i}" for i in range(n)]
    started = time.perf_counter()
    if mode == "asyncio":
        import openai

        async def run():
            client = openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0)
            gate = asyncio.Semaphore(concurrency)

            async def one(item):
                async with gate:
                    answer = await client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": item}], max_tokens=1024)
                    return answer.choices[0].message.content

            return await asyncio.gather(*(one(item) for item in items))

        answers = asyncio.run(run())
    else:
        import openai

        client = openai.OpenAI(base_url=url, api_key="bench", max_retries=0)

        def one(item):
            answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": item}],
                                                    max_tokens=1024)
            return answer.choices[0].message.content

        with ThreadPoolExecutor(concurrency) as pool:
            answers = list(pool.map(one, items))
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    assert answers == [f"echo: {item}" for item in items]
    print(json.dumps({"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
                      "peak_rss_mb": usage.ru_maxrss / 1024}))


def anchor(bench: Bench, results: dict) -> None:
    n, latency = bench.args.anchor_items, bench.args.latency
    rows = []
    for concurrency in (16, 64):
        bench.fresh()
        worker = bench.worker(LEASH_ITEM_CONCURRENCY=str(concurrency))
        time.sleep(1.0)
        before = _cpu_seconds(worker.pid)
        job_id, _ = bench.job(n)
        fields = bench.wait_ended(job_id, timeout=n * latency + 60)
        leash_wall = float(fields["ended_at"]) - float(fields["started_at"])
        leash_cpu = _cpu_seconds(worker.pid) - before
        row = {"concurrency": concurrency, "leash_items_s": round(n / leash_wall, 2),
               "leash_cpu_s": round(leash_cpu, 2)}
        for mode in ("asyncio", "threads"):
            bench.fresh()
            out = subprocess.run([sys.executable, __file__, "--anchor", mode, "--url", bench.server.url,
                                  "--anchor-items", str(n), "--concurrency", str(concurrency)],
                                 capture_output=True, text=True, timeout=n * latency + 60, cwd=ROOT,
                                 env=dict(os.environ, PYTHONPATH=str(ROOT)))
            if out.returncode != 0:
                raise SystemExit(f"anchor {mode} failed: {out.stderr[-2000:]}")
            figures = json.loads(out.stdout.strip().splitlines()[-1])
            row[f"{mode}_items_s"] = round(n / figures["wall_s"], 2)
            row[f"{mode}_cpu_s"] = round(figures["cpu_s"], 2)
            row[f"{mode}_rss_mb"] = round(figures["peak_rss_mb"], 1)
        row["leash_vs_asyncio"] = round(row["leash_items_s"] / row["asyncio_items_s"], 3)
        row["leash_vs_threads"] = round(row["leash_items_s"] / row["threads_items_s"], 3)
        rows.append(row)
    print(f"\n## anchor: {n} items x {latency} s; items/s (CPU seconds of the calling process)")
    print("| concurrency | leash worker | asyncio + semaphore | thread pool | leash / asyncio | leash / threads | "
          "asyncio RSS | threads RSS |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['leash_items_s']} ({r['leash_cpu_s']} s) | {r['asyncio_items_s']} "
              f"({r['asyncio_cpu_s']} s) | {r['threads_items_s']} ({r['threads_cpu_s']} s) | "
              f"{r['leash_vs_asyncio']:.2f}x | {r['leash_vs_threads']:.2f}x | {r['asyncio_rss_mb']} MB | "
              f"{r['threads_rss_mb']} MB |")
    results["anchor"] = rows


def _cpu_seconds(worker_pid: int) -> float:
    """CPU time of a worker and its children so far (the work-horse is reaped into the worker's
    children times only when it exits, so read the live horse too)."""
    total = 0.0
    try:
        worker = psutil.Process(worker_pid)
        times = worker.cpu_times()
        total += times.user + times.system + times.children_user + times.children_system
        for child in worker.children(recursive=True):
            t = child.cpu_times()
            total += t.user + t.system
    except psutil.Error:
        pass
    return total


# --- rpm -----------------------------------------------------------------------------------

def rpm(bench: Bench, results: dict) -> None:
    server = bench.fresh()
    for _ in range(2):
        bench.worker(LEASH_MODEL_RPM="600")
    time.sleep(1.0)
    jobs = [bench.job(200, owner=owner, prefix=owner)[0] for owner in ("alice", "bob")]
    for job_id in jobs:
        bench.wait_ended(job_id, timeout=200)
    times = sorted(seen.at for seen in server.requests)
    overall = (len(times) - 1) / (times[-1] - times[0]) * 60
    windows = []
    start = times[0]
    while start + 10 <= times[-1]:
        windows.append(sum(1 for t in times if start <= t < start + 10) * 6)
        start += 1
    workers_used = {bench.conn.hget(keys.job(j), "worker") for j in jobs}
    print("\n## rpm: LEASH_MODEL_RPM=600, 2 workers, 2 jobs x 200 items x 0.5 s")
    print(f"{len(times)} requests in {times[-1] - times[0]:.1f} s = {overall:.1f} requests/minute "
          f"({overall / 600:.1%} of 600); 10-s windows: {min(windows)}..{max(windows)} per minute "
          f"({min(windows) / 600:.1%}..{max(windows) / 600:.1%}); jobs ran on {len(workers_used)} workers")
    results["rpm"] = {"requests": len(times), "overall_rpm": round(overall, 1),
                      "window_min_rpm": min(windows), "window_max_rpm": max(windows)}


# --- storm ---------------------------------------------------------------------------------

def storm(bench: Bench, results: dict) -> None:
    n, latency, capacity = bench.args.storm_items, bench.args.latency, 8
    server = bench.fresh(capacity=capacity, retry_after="1")
    log_path = str(bench.redis.dir / "storm-worker.log")
    bench.worker(log_path=log_path, LEASH_ITEM_CONCURRENCY="16")
    time.sleep(1.0)
    limits: list[int] = []
    stop = threading.Event()

    def sample():
        while not stop.wait(0.25):
            raw = bench.conn.hget(keys.model_concurrency(MODEL), "limit")
            if raw is not None:
                limits.append(int(raw))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    job_id, _ = bench.job(n)
    fields = bench.wait_ended(job_id, timeout=n * latency + 120)
    stop.set()
    sampler.join()
    wall = float(fields["ended_at"]) - float(fields["started_at"])
    answered, refused = len(server.requests), server.rate_limited
    throughput = n / wall
    ideal = capacity / latency
    second_half = limits[len(limits) // 2:]
    changes = [line.split("concurrency", 1)[1].strip() for line in open(log_path) if "concurrency" in line
               and "->" in line]
    print(f"\n## storm: the server takes {capacity} calls at once, 429 + Retry-After: 1 beyond; "
          f"LEASH_ITEM_CONCURRENCY=16; {n} items x {latency} s")
    print(f"calls {answered + refused}, of which 429: {refused} ({refused / (answered + refused):.1%}); "
          f"throughput {throughput:.2f} items/s = {throughput / ideal:.1%} of the server's {ideal:.0f}/s; "
          f"wall {wall:.1f} s (ideal {n / ideal:.1f} s)")
    print(f"shared limit over the run: {_histogram(limits)}; second half: {_histogram(second_half)}")
    print(f"worker log, first changes: {'; '.join(changes[:6])}")
    results["storm"] = {"calls": answered + refused, "429s": refused, "share_429": round(refused / (answered + refused), 4),
                        "items_per_s": round(throughput, 2), "of_capacity": round(throughput / ideal, 3),
                        "limit_histogram": _histogram(limits), "limit_changes": len(changes)}


def _histogram(values: list[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return dict(sorted(counts.items()))


# --- kill ----------------------------------------------------------------------------------

def kill(bench: Bench, results: dict) -> None:
    n, concurrency = 240, 16
    server = bench.fresh()
    first = bench.worker(LEASH_ITEM_CONCURRENCY=str(concurrency))
    job_id, items = bench.job(n)
    if not wait_until(lambda: int(bench.conn.hget(keys.job(job_id), "done") or 0) >= n // 4, 60):
        raise SystemExit("no progress before the kill")
    bench.children.signal_tree(first, signal.SIGKILL)
    killed_at = time.time()
    stored_at_kill = {int(k) for k in bench.conn.hkeys(keys.items(job_id))}
    asked_before = len(server.requests)
    bench.worker(LEASH_ITEM_CONCURRENCY=str(concurrency))
    fields = bench.wait_ended(job_id, timeout=120)
    final = {int(k): json.loads(v) for k, v in bench.conn.hgetall(keys.items(job_id)).items()}
    asked_after = [items.index(s.item) for s in server.requests[asked_before:]]
    calls: dict[str, int] = {}
    for seen in server.requests:
        calls[seen.item] = calls.get(seen.item, 0) + 1
    redone = sum(c - 1 for c in calls.values())
    ok = (final == {i: f"echo: item-{i}" for i in range(n)} and not set(asked_after) & stored_at_kill)
    print(f"\n## kill: SIGKILL of worker + work-horse at concurrency {concurrency}, {n} items, lease 5 s")
    print(f"stored at the kill: {len(stored_at_kill)}; every item stored once with its answer and no stored "
          f"item asked again: {ok}; calls redone: {redone} (goal <= {concurrency}); attempts {fields['attempts']}; "
          f"job done {float(fields['ended_at']) - killed_at:.1f} s after the kill")
    results["kill"] = {"stored_at_kill": len(stored_at_kill), "exactly_once": ok, "redone": redone,
                       "attempts": int(fields["attempts"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(PARTS))
    parser.add_argument("--items", type=int, default=120)
    parser.add_argument("--storm-items", type=int, default=480)
    parser.add_argument("--anchor-items", type=int, default=480)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--anchor", choices=("asyncio", "threads"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=16, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.anchor:
        return anchor_main(args.anchor, args.url, args.anchor_items, args.concurrency)
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s) {sorted(unknown)}; choose from {','.join(PARTS)}")
    print(f"bench_items {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, load {os.getloadavg()[0]:.2f}")
    bench = Bench(args)
    results: dict = {}
    try:
        for part in parts:
            globals()[part](bench, results)
    finally:
        bench.close()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
