#!/usr/bin/env python3
"""Benchmark of a state filter (``GET /jobs?state=failed``, ``leash jobs --state``): one owner
with 1,000 / 10,000 / 100,000 jobs, 10 of them failed and older than the rest (the case where
the scan that came before the state indexes found none), the first page of 20.

    python benchmarks/bench_listing.py                 # a Redis of its own on a free port
    REDIS_URL=redis://127.0.0.1:6379/11 python benchmarks/bench_listing.py --flush

"before" is the read that served filters before the indexes (and still serves them on a store
whose older jobs are not indexed yet): the owner's newest 10,000 jobs read and their state
decided one by one. "after" is ``jobs.read.listing.list_jobs``: the owner's index of that state.
Each figure is the median of ``--repeat`` reads; the jobs are written as ``enqueue`` writes
them (queued, RQ's side included), pipelined.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchlib import OwnRedis  # noqa: E402

from jobs import keys  # noqa: E402
from jobs.config import settings  # noqa: E402
from jobs.core import state_index  # noqa: E402
from jobs.core.store.connection import connect  # noqa: E402
from jobs.deadletter.synthetic import FailedJob, write_failed_jobs  # noqa: E402
from jobs.enqueue import _write_job, rq_queue  # noqa: E402
from jobs.read import listing  # noqa: E402

OWNER = "bench"
ITEMS = {"items": ["a", "b"], "labels": ["x", "y"]}


def write_jobs(conn, queued: int, failed: int, now: float) -> None:
    write_failed_jobs(conn, [FailedJob("classify", "boom", failed_at=now - 100_000 + n, owner=OWNER)
                             for n in range(failed)], now=now)
    q, s = rq_queue(conn), settings()
    for first in range(0, queued, 1000):
        with conn.pipeline() as pipe:
            for n in range(first, min(queued, first + 1000)):
                _write_job(pipe, q, f"j{n:07d}", "classify", ITEMS, OWNER, 3, 2, now - 50_000 + n, s)
            pipe.execute()


def before(conn, state: str, now: float) -> tuple[int, int]:
    """The scan-and-decide read (the fallback in jobs/read/listing.py), then the page's fields."""
    matching = listing._scanned_ids_in_state(conn, OWNER, state, now)
    page = matching[:20]
    with conn.pipeline(transaction=False) as pipe:
        for job_id in page:
            pipe.hgetall(keys.job(job_id))
            pipe.hget(keys.rq_job(job_id), "status")
        pipe.execute()
    return len(matching), len(page)


def after(conn, state: str, now: float) -> tuple[int, int]:
    total, page = listing.list_jobs(conn, OWNER, 0, 20, state=state, now=now)
    return total, len(page)


def timed(fn, repeat: int, *args) -> tuple[float, tuple[int, int]]:
    runs, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn(*args)
        runs.append((time.perf_counter() - start) * 1000)
    return statistics.median(runs), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--flush", action="store_true", help="empty the database in REDIS_URL first")
    args = parser.parse_args()
    own = None
    url = os.environ.get("REDIS_URL")
    if not url:
        own = OwnRedis().start()
        url = own.url
    conn = connect(url)
    try:
        print(f"# {platform.node()} {os.cpu_count()} cores, Redis {conn.info()['redis_version']}")
        print("| jobs | state=failed before | after | found before | after | state=queued before | after |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for size in (int(s) for s in args.sizes.split(",")):
            if args.flush or own:
                conn.flushdb()
            elif conn.dbsize():
                sys.exit("the database is not empty: pass --flush to empty it")
            now = time.time()
            state_index.backfill_step(conn)  # an empty store: indexed at once
            write_jobs(conn, size - 10, 10, now)
            slow = max(3, args.repeat // 4)  # the scan takes seconds at 100,000 jobs
            failed_before = timed(before, slow, conn, "failed", now)
            failed_after = timed(after, args.repeat, conn, "failed", now)
            queued_before = timed(before, slow, conn, "queued", now)
            queued_after = timed(after, args.repeat, conn, "queued", now)
            print(f"| {size:,} | {failed_before[0]:.1f} ms | {failed_after[0]:.2f} ms | {failed_before[1][0]} "
                  f"| {failed_after[1][0]} | {queued_before[0]:.1f} ms | {queued_after[0]:.2f} ms |", flush=True)
    finally:
        conn.close()
        if own:
            own.close()


if __name__ == "__main__":
    main()
