#!/usr/bin/env python3
"""Benchmark of the dead-letter path: the failure report over 100,000 failed jobs and the
replay of 10,000 of them, with the Redis round trips each used.

    REDIS_URL=redis://127.0.0.1:6379/11 python benchmarks/bench_deadletter.py --flush

It writes failed jobs straight into Redis (jobs/deadletter/synthetic.py) with ~30 realistic error
shapes carrying ids, numbers, URLs and paths, spread over 50 owners and 4 kinds. ``--flush``
empties the database in REDIS_URL first (only that database); without it the database must
be empty. ``--compare-rq N`` also times RQ's own per-job requeue (FailedJobRegistry.requeue,
which routes rate-limited jobs through RQ's limiter) on N more jobs, for comparison.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import redis  # noqa: E402
from rq.registry import FailedJobRegistry  # noqa: E402
from rq.serializers import JSONSerializer  # noqa: E402

from jobs import deadletter, failures  # noqa: E402
from jobs.core.store.connection import connect  # noqa: E402
from jobs.deadletter.synthetic import FailedJob, traceback_text, write_failed_jobs  # noqa: E402

KINDS = ["classify", "summarize", "extract", "embed"]


def _id(rng):
    return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") for _ in range(24))


SHAPES = [
    lambda r: f"TimeoutError: model call timed out after {r.uniform(30, 600):.1f}s",
    lambda r: f"TimeoutError: request {uuid.UUID(int=r.getrandbits(128))} to https://api.openai.com/v1/chat/completions timed out",
    lambda r: f"RateLimitError: Error code: 429 - rate limit reached for gpt-4o-mini in organization org-{_id(r)} on tokens per min: Limit {r.randint(1, 9) * 10000}, Used {r.randint(1000, 99999)}",
    lambda r: f"APIConnectionError: Connection error to https://api.openai.com/v1/chat/completions (attempt {r.randint(1, 5)})",
    lambda r: f"InternalServerError: Error code: 500 - request id req_{r.getrandbits(64):016x}",
    lambda r: f"BadRequestError: Error code: 400 - This model's maximum context length is 128000 tokens. However, your messages resulted in {r.randint(128001, 300000)} tokens",
    lambda r: f"KeyError: 'label_{r.randint(0, 500)}'",
    lambda r: f"IndexError: list index out of range (item {r.randint(0, 999)} of {r.randint(1000, 5000)})",
    lambda r: f"ValueError: invalid literal for int() with base 10: '{r.randint(0, 99)}x'",
    lambda r: f"json.decoder.JSONDecodeError: Expecting ',' delimiter: line {r.randint(1, 90)} column {r.randint(1, 300)} (char {r.randint(1, 9000)})",
    lambda r: f"ConnectionError: Error 111 connecting to 10.0.{r.randint(0, 9)}.{r.randint(1, 254)}:6379. Connection refused.",
    lambda r: f"redis.exceptions.TimeoutError: Timeout reading from 10.0.{r.randint(0, 9)}.{r.randint(1, 254)}:6379",
    lambda r: f"FileNotFoundError: [Errno 2] No such file or directory: '/tmp/leash/{_id(r)}/input.jsonl'",
    lambda r: f"PermissionError: [Errno 13] Permission denied: '/var/data/exports/{r.randint(1, 99999)}.csv'",
    lambda r: f"OSError: [Errno 28] No space left on device: '/app/cache/{r.getrandbits(40):x}.bin'",
    lambda r: f"MemoryError: cannot allocate {r.randint(1, 64)} GiB for embedding matrix at 0x{r.getrandbits(48):x}",
    lambda r: f"PermanentError: the model rejected the prompt of job {_id(r)}: content policy",
    lambda r: f"lease expired {r.uniform(0, 90):.1f}s ago on worker {r.getrandbits(128):032x}: the worker stopped renewing it (killed, hung or partitioned)",
    lambda r: f"worker process died: Work-horse terminated unexpectedly; waitpid returned {r.randint(9, 137)} (signal {r.choice([9, 15])})",
    lambda r: "canceled",
    lambda r: f"RuntimeError: deferred 10 times, the limit (LEASH_MAX_DEFERS=10); last: retry after {r.randint(1, 120)}s",
    lambda r: f"SSLError: HTTPSConnectionPool(host='storage.example.com', port=443): Max retries exceeded with url: /bucket/{_id(r)}/result.json",
    lambda r: f"HTTPError: 503 Server Error: Service Unavailable for url: https://storage.example.com/upload?id={r.getrandbits(32)}",
    lambda r: f"UnicodeDecodeError: 'utf-8' codec can't decode byte 0x{r.randint(128, 255):x} in position {r.randint(0, 4000)}: invalid start byte",
    lambda r: f"AssertionError: expected {r.randint(1, 50)} labels, got {r.randint(51, 99)}",
    lambda r: f"TypeError: 'NoneType' object is not subscriptable (item {_id(r)})",
    lambda r: f"SMTPRecipientsRefused: {{'user{r.randint(1, 99999)}@example.com': (550, b'mailbox unavailable')}}",
    lambda r: f"ValidationError: 1 validation error for Answer\\nscore: value {r.uniform(1, 10):.3f} is greater than 1",
    lambda r: f"ZeroDivisionError: division by zero in batch {r.randint(1, 400)}",
    lambda r: f"psycopg.OperationalError: connection to server at \"db-{r.randint(1, 4)}.internal\" (10.1.{r.randint(0, 9)}.{r.randint(1, 254)}), port 5432 failed",
]


class RoundTrips:
    """Counts client round trips: one per plain command, one per pipeline execute."""

    def __init__(self):
        self.count = 0
        plain, piped = redis.client.Redis.execute_command, redis.client.Pipeline.execute
        counter = self

        def execute_command(self, *args, **kwargs):
            counter.count += 1
            return plain(self, *args, **kwargs)

        def execute(self, *args, **kwargs):
            counter.count += 1
            return piped(self, *args, **kwargs)

        redis.client.Redis.execute_command = execute_command
        redis.client.Pipeline.execute = execute


@contextmanager
def measured(trips: RoundTrips, label: str, results: dict):
    before, start = trips.count, time.perf_counter()
    yield
    results[label] = (time.perf_counter() - start, trips.count - before)


def make_jobs(n: int, rng: random.Random, now: float):
    for _i in range(n):
        summary = rng.choice(SHAPES)(rng)
        yield FailedJob(kind=rng.choice(KINDS), error=traceback_text(summary, frames=rng.randint(4, 12)),
                        failed_at=now - rng.uniform(0, 20 * 3600), owner=f"customer-{rng.randint(1, 50)}",
                        payload={"items": [f"item {j}" for j in range(4)]},
                        done_items={j: f"ITEM {j}" for j in range(rng.randint(0, 3))})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--replay", type=int, default=10_000)
    parser.add_argument("--compare-rq", type=int, default=1_000, metavar="N")
    parser.add_argument("--flush", action="store_true", help="empty the database in REDIS_URL first")
    args = parser.parse_args()
    if not os.environ.get("REDIS_URL"):
        parser.error("set REDIS_URL to a database this benchmark may fill, e.g. redis://127.0.0.1:6379/11")
    conn = connect()
    if args.flush:
        conn.flushdb()
    elif conn.dbsize():
        parser.error("the database in REDIS_URL is not empty; pass --flush to empty it first")

    rng = random.Random(4)
    now = time.time()
    print(f"machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, "
          f"Redis {conn.info('server')['redis_version']}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    start = time.perf_counter()
    write_failed_jobs(conn, make_jobs(args.jobs, rng, now), now=now, batch=1000)
    print(f"wrote {args.jobs} failed jobs in {time.perf_counter() - start:.1f} s")

    trips = RoundTrips()
    results: dict = {}
    with measured(trips, "report", results):
        report = failures.report(conn, since=None)
    print(f"report: {report['total']} failed jobs in {len(report['groups'])} groups "
          f"in {results['report'][0]:.2f} s, {results['report'][1]} round trips")
    for group in report["groups"][:5]:
        print(f"  {group['count']:>6}  {group['kind']:<10} {group['error']}")

    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cli", "failures", "--since", "all", "--json"], check=True,
                   stdout=subprocess.DEVNULL, cwd=ROOT)
    print(f"`leash failures --since all --json` as a command (process start included): "
          f"{time.perf_counter() - start:.2f} s")

    entries = failures.failed_ids(conn, None)
    rng.shuffle(entries)
    chosen = entries[:args.replay]
    with measured(trips, "replay", results):
        selection = deadletter.select(conn, chosen)
        outcome = deadletter.replay(conn, selection.matched, "bench", {"ids": len(chosen)})
    print(f"replay: {len(outcome.replayed)} jobs by id (select + replay + audit) in {results['replay'][0]:.2f} s, "
          f"{results['replay'][1]} round trips; skipped {len(outcome.skipped)}")

    if args.compare_rq:
        rq_sample = write_failed_jobs(conn, make_jobs(args.compare_rq, rng, now), now=now, batch=1000)
        registry = FailedJobRegistry("leash", connection=conn, serializer=JSONSerializer)
        with measured(trips, "rq", results):
            for job_id in rq_sample:
                registry.requeue(job_id)
        seconds, count = results["rq"]
        print(f"for comparison, RQ's per-job requeue (RQ's side only) of {len(rq_sample)} more jobs: {seconds:.2f} s, "
              f"{count} round trips -> {seconds / len(rq_sample) * args.replay:.1f} s for {args.replay}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
