"""Many short model jobs: leash against plain RQ, side by side, in one run on one Redis.

    python benchmarks/bench_small_jobs.py [--jobs 60] [--rounds 3] [--latency 0.05]

Each job is one model call to the loopback OpenAI-compatible server of the tests
(tests/fake_openai.py, so '.[test]' must be installed), answering after ``--latency`` s.
leash: ``prompt`` jobs of one item on ``leash worker --burst``; plain RQ: a function making
the same call through the same SDK on ``rq worker --burst``. Both fork a work-horse per job;
leash's worker loads the model client once, before it forks (jobs.models.backends.preload),
a plain RQ work-horse imports the function's module, and so the SDK, for every job.

Reports jobs per second (the first job's start to the last job's end, from RQ's own
timestamps, so process start-up is not counted) and the median seconds one job takes from
its start to its end, median of the rounds, and one JSON line. Every process it starts is
killed by pid at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from datetime import UTC, datetime

from bench_lifecycle import job_span, run_burst
from benchlib import Children, OwnRedis, worker_env
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.enqueue import enqueue
from tests.fake_openai import MODEL, FakeOpenAI

PLAIN_CALL = "benchmarks.plain_rq_jobs.one_model_call"


def per_job_seconds(conn, ids: list[str]) -> float:
    jobs = Job.fetch_many(ids, connection=conn, serializer=JSONSerializer)
    return statistics.median((j.ended_at - j.started_at).total_seconds() for j in jobs)


def leash_round(children, own, conn, server, n: int) -> dict:
    conn.flushdb()
    ids = [enqueue(conn, "prompt", {"items": [f"item-{i}"], "template": "{item}"}, owner=f"user-{i}")[0]
           for i in range(n)]
    env = worker_env(own.url, LEASH_MODEL_URL=server.url, LEASH_MODEL_NAME=MODEL, LEASH_MODEL_API_KEY="bench")
    run_burst(children, [sys.executable, "-m", "cli", "worker", "--burst", "--log-level", "WARNING"], env, 600)
    ok = sum(1 for i in ids if conn.hget(keys.job(i), "state") == b"succeeded")
    if ok != n:
        raise RuntimeError(f"leash: only {ok} of {n} jobs succeeded")
    return {"jobs_per_s": n / job_span(conn, ids), "per_job_s": per_job_seconds(conn, ids)}


def rq_round(children, own, conn, server, n: int) -> dict:
    conn.flushdb()
    q = Queue("bench-plain", connection=conn, serializer=JSONSerializer)
    ids = [q.enqueue_call(PLAIN_CALL, args=(server.url, MODEL, f"item-{i}")).id for i in range(n)]
    run_burst(children, [sys.executable, "-m", "rq.cli", "worker", "--burst", "-q", "-S", "json",
                         "-u", own.url, "bench-plain"], worker_env(own.url), 600)
    ok = sum(1 for j in Job.fetch_many(ids, connection=conn, serializer=JSONSerializer) if j.is_finished)
    if ok != n:
        raise RuntimeError(f"rq: only {ok} of {n} jobs finished")
    return {"jobs_per_s": n / job_span(conn, ids), "per_job_s": per_job_seconds(conn, ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.05)
    args = parser.parse_args()
    print(f"bench_small_jobs {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, load {os.getloadavg()[0]:.2f}; {args.jobs} one-call jobs, "
          f"model latency {args.latency} s, {args.rounds} rounds")
    own, children = OwnRedis().start(), Children()
    server = FakeOpenAI(latency=args.latency).start()
    rounds: dict[str, list[dict]] = {"leash": [], "rq": []}
    try:
        conn = own.client()
        for r in range(args.rounds):  # alternate who goes first, so neither always runs on a warm machine
            for side, run in (("leash", leash_round), ("rq", rq_round))[:: 1 if r % 2 == 0 else -1]:
                rounds[side].append(run(children, own, conn, server, args.jobs))
    finally:
        children.cleanup()
        server.stop()
        own.close()
    result = {side: {k: round(statistics.median(r[k] for r in rs), 3) for k in ("jobs_per_s", "per_job_s")}
              for side, rs in rounds.items()}
    print("| | jobs/s | one job, start to end |")
    print("|---|---:|---:|")
    for side in ("leash", "rq"):
        print(f"| {side} | {result[side]['jobs_per_s']:.1f} | {result[side]['per_job_s'] * 1000:.0f} ms |")
    ratio = result["leash"]["jobs_per_s"] / result["rq"]["jobs_per_s"]
    print(f"leash / plain RQ, jobs per second: {ratio:.2f}x")
    print(json.dumps({**result, "leash_vs_rq": round(ratio, 2), "jobs": args.jobs, "latency": args.latency}))


if __name__ == "__main__":
    main()
