"""Enqueue and drain: leash against plain RQ, side by side, in one run on one Redis.

    python benchmarks/bench_enqueue_drain.py [--enqueue 100000] [--drain 2000] [--workers 4]

enqueue  ``--enqueue`` jobs one call each: leash's ``jobs.enqueue.enqueue`` (``noop``, 100 owners)
         against RQ's ``Queue.enqueue_call`` of a plain function; seconds, jobs/s, and Redis
         commands per job (``INFO commandstats`` deltas, commands run by Lua included).
drain    ``--drain`` jobs of one item each (leash's ``one_item`` kind: claim, the item's
         checkpoint, finish; plain RQ: ``plain_rq_jobs.one_item``), run by ``--workers``
         ``--burst`` workers started at once; jobs/s from the first job's start to the last
         job's end (RQ's own timestamps) and Redis commands per job over the whole drain
         (the workers' start and stop included), with the commands that cost the most.

A Redis of its own on a free loopback port; every process it starts is killed by pid.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from bench_lifecycle import job_span, subprocess_devnull
from benchlib import Children, OwnRedis, commandstats, worker_env
from rq import Queue
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.enqueue import enqueue

OWNERS = 100


def counted(conn, fn) -> tuple[float, dict]:
    """Seconds ``fn`` took and the commands Redis ran meanwhile, by name."""
    conn.config_resetstat()
    began = time.perf_counter()
    fn()
    seconds = time.perf_counter() - began
    stats = commandstats(conn)
    for own in ("config|resetstat", "info"):
        stats.pop(own, None)
    return seconds, stats


def side_result(n: int, seconds: float, stats, span: float | None = None) -> dict:
    total = sum(stats.values())
    out = {"seconds": round(seconds, 2), "jobs_per_s": round(n / (span or seconds), 1),
           "commands_per_job": round(total / n, 1),
           "top_per_job": {k: round(v / n, 2) for k, v in stats.most_common(8)}}
    if span is not None:
        out["span_s"] = round(span, 2)
    return out


def bench_enqueue(conn, n: int) -> dict:
    plain = Queue("bench-plain", connection=conn, serializer=JSONSerializer)
    conn.flushdb()
    rq_s, rq_stats = counted(conn, lambda: [plain.enqueue_call("benchmarks.plain_rq_jobs.noop", args=("noop", {}))
                                            for _ in range(n)])
    conn.flushdb()
    leash_s, leash_stats = counted(conn, lambda: [enqueue(conn, "noop", {}, owner=f"user-{i % OWNERS}")
                                                  for i in range(n)])
    conn.flushdb()
    return {"rq": side_result(n, rq_s, rq_stats), "leash": side_result(n, leash_s, leash_stats)}


def drain(children: Children, conn, argv: list[str], env: dict, workers: int, timeout: float) -> float:
    procs = [children.start(argv, env, stdout=subprocess_devnull(), stderr=subprocess_devnull())
             for _ in range(workers)]
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    return 0.0


def bench_drain(children: Children, own: OwnRedis, conn, n: int, workers: int) -> dict:
    env = worker_env(own.url, LEASH_QUEUE="leash")
    out = {}
    conn.flushdb()
    q = Queue("bench-plain", connection=conn, serializer=JSONSerializer)
    ids = [q.enqueue_call("benchmarks.plain_rq_jobs.one_item", args=("one_item", {"items": ["x"]})).id
           for _ in range(n)]
    rq_argv = [sys.executable, "-m", "rq.cli", "worker", "--burst", "-q", "-S", "json", "-u", own.url, "bench-plain"]
    seconds, stats = counted(conn, lambda: drain(children, conn, rq_argv, env, workers, 600))
    out["rq"] = side_result(n, seconds, stats, span=job_span(conn, ids))
    conn.flushdb()
    ids = [enqueue(conn, "one_item", {"items": ["x"]}, owner=f"user-{i % OWNERS}")[0] for i in range(n)]
    leash_argv = [sys.executable, "-m", "cli", "worker", "--burst", "--log-level", "WARNING"]
    seconds, stats = counted(conn, lambda: drain(children, conn, leash_argv, env, workers, 600))
    ok = sum(1 for i in ids if conn.hget(keys.job(i), "state") == b"succeeded")
    if ok != n:
        raise RuntimeError(f"leash: only {ok} of {n} jobs succeeded")
    out["leash"] = side_result(n, seconds, stats, span=job_span(conn, ids))
    conn.flushdb()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--enqueue", type=int, default=100000, help="jobs enqueued per side (0: skip)")
    parser.add_argument("--drain", type=int, default=2000, help="one-item jobs drained per side (0: skip)")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    os.environ.update(LEASH_IMPORTS="benchmarks.chaos_kinds", LEASH_QUEUE="leash")
    import benchmarks.chaos_kinds  # noqa: F401  (registers the kinds in this process)

    own = OwnRedis().start()
    children = Children()
    conn = own.client()
    results = {}
    try:
        if args.enqueue:
            results["enqueue"] = e = bench_enqueue(conn, args.enqueue)
            print(f"enqueue {args.enqueue}: leash {e['leash']['seconds']} s ({e['leash']['jobs_per_s']}/s, "
                  f"{e['leash']['commands_per_job']} commands/job), RQ {e['rq']['seconds']} s "
                  f"({e['rq']['jobs_per_s']}/s, {e['rq']['commands_per_job']} commands/job): leash takes "
                  f"{e['leash']['seconds'] / e['rq']['seconds']:.2f}× RQ's time", flush=True)
            print(f"  leash per job: {e['leash']['top_per_job']}", flush=True)
        if args.drain:
            results["drain"] = d = bench_drain(children, own, conn, args.drain, args.workers)
            print(f"drain {args.drain} one-item jobs, {args.workers} workers: leash {d['leash']['jobs_per_s']}/s "
                  f"({d['leash']['commands_per_job']} commands/job), RQ {d['rq']['jobs_per_s']}/s "
                  f"({d['rq']['commands_per_job']} commands/job): leash at "
                  f"{d['leash']['jobs_per_s'] / d['rq']['jobs_per_s']:.2f}× RQ's throughput", flush=True)
            print(f"  leash per job: {d['leash']['top_per_job']}", flush=True)
            print(f"  RQ per job: {d['rq']['top_per_job']}", flush=True)
    finally:
        children.cleanup()
        own.stop()
        own.close()
    print(json.dumps({"bench": "enqueue_drain", "workers": args.workers, **results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
