"""How fast a dead machine's job comes back on default settings, and what the lease costs.

    python benchmarks/bench_reclaim.py [--trials 3] [--window 30] [--rq-cap 60]

Measures, on one Redis of its own, with the shipped defaults (LEASH_LEASE_SECONDS unset):
  reclaim     seconds from SIGKILL (or SIGSTOP) of a worker and its work-horse until the job runs
              again under another worker; plain RQ 3.0 (two ``rq worker``, defaults) for the same
              kill: seconds until the job leaves ``started``, capped at --rq-cap
  renewal     a job waiting on one model call longer than the window (the fake model server of
              the tests, so '.[test]' must be installed): lease renewals per minute (each a write
              of the job hash and the lease index, read back from the job's lease_expires_at) and
              every Redis command the worker sends per minute (INFO commandstats deltas), for the
              new default lease (20 s), the old one (120 s) and plain RQ running a sleep job
Prints a table and one JSON line. Every process it starts is killed by pid at the end.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from datetime import UTC, datetime

from bench_lifecycle import rq_reclaim
from benchlib import ROOT, Children, OwnRedis, commandstats, wait_until, worker_env

from jobs import keys
from jobs.enqueue import enqueue
from tests.fake_openai import FakeOpenAI, Slow

WORKER = [sys.executable, "-m", "cli", "worker", "--log-level", "ERROR"]


def leash_env(url: str, **extra: str) -> dict:
    env = worker_env(url, **extra)
    env.pop("LEASH_LEASE_SECONDS", None)  # the defaults, whatever the caller's shell says
    return env


def reclaim_once(children: Children, own: OwnRedis, conn, how: int) -> float:
    conn.flushdb()
    env = leash_env(own.url, LEASH_LOCAL_DELAY_MS="300")
    trial = time.monotonic_ns()  # names of their own: a killed worker's registration outlives it
    procs = {name: children.start(WORKER + ["--name", name], env) for name in (f"a-{trial}", f"b-{trial}")}
    job_id, _ = enqueue(conn, "classify", {"items": [f"item {i}" for i in range(400)], "labels": ["a", "b"]})
    holder = wait_until(lambda: int(conn.hget(keys.job(job_id), "done") or 0) >= 2
                        and conn.hget(keys.job(job_id), "worker"), 60)
    if not holder:
        raise RuntimeError("reclaim: the job never started")
    children.signal_tree(procs[holder.decode()], how)
    stopped = time.monotonic()
    again = wait_until(lambda: conn.hget(keys.job(job_id), "attempts") == b"2"
                       and conn.hget(keys.job(job_id), "state") == b"running", 90, interval=0.05)
    if not again:
        raise RuntimeError("reclaim: the job did not run again within 90 s")
    seconds = time.monotonic() - stopped
    for proc in procs.values():
        children.signal_tree(proc, signal.SIGKILL)
    return round(seconds, 1)


def renewal_cost(children: Children, own: OwnRedis, conn, model: FakeOpenAI, window: float,
                 lease: float | None) -> dict:
    conn.flushdb()
    extra = {"LEASH_MODEL_URL": model.url, "LEASH_MODEL_NAME": "fake-model", "LEASH_MODEL_API_KEY": "k",
             "LEASH_MODEL_TIMEOUT": str(window + 30)}
    env = leash_env(own.url, **extra)
    if lease is not None:
        env["LEASH_LEASE_SECONDS"] = str(lease)
    item = f"slow {time.monotonic_ns()} -> a"
    model.on(item, Slow(window + 15))
    proc = children.start(WORKER + ["--name", "bench-renew", "--no-scheduler"], env)
    job_id, _ = enqueue(conn, "classify", {"items": [item], "labels": ["a", "b"]})
    if not wait_until(lambda: model.seen(item), 60):
        raise RuntimeError("renewal: the model call never started")
    time.sleep(1.0)  # past the call's start: only the steady state is measured
    conn.config_resetstat()
    renewals, last = 0, conn.hget(keys.job(job_id), "lease_expires_at")
    end = time.monotonic() + window
    while time.monotonic() < end:
        now = conn.hget(keys.job(job_id), "lease_expires_at")
        renewals += now != last
        last = now
        time.sleep(0.1)
    stats = commandstats(conn)
    children.signal_tree(proc, signal.SIGKILL)
    # The polling itself (HGETs by this script, CONFIG) is not the worker's.
    sent = sum(stats.values()) - stats.get("hget", 0) - stats.get("config|resetstat", 0)
    return {"renewals_per_min": round(renewals * 60 / window, 1), "worker_commands_per_min": round(sent * 60 / window)}


def rq_running_cost(children: Children, own: OwnRedis, conn, window: float) -> dict:
    from rq import Queue
    from rq.serializers import JSONSerializer

    conn.flushdb()
    proc = children.start([sys.executable, "-m", "rq.cli", "worker", "-q", "-S", "json", "-u", own.url, "bench-rq"],
                          worker_env(own.url))
    job = Queue("bench-rq", connection=conn, serializer=JSONSerializer).enqueue_call(
        "benchmarks.plain_rq_jobs.sleep", args=("sleep", {"seconds": window + 15}), timeout=600)
    if not wait_until(lambda: job.get_status(refresh=True) == "started", 60):
        raise RuntimeError("rq: the job never started")
    time.sleep(1.0)
    conn.config_resetstat()
    time.sleep(window)
    stats = commandstats(conn)
    children.signal_tree(proc, signal.SIGKILL)
    return {"worker_commands_per_min": round((sum(stats.values()) - stats.get("config|resetstat", 0)) * 60 / window)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--window", type=float, default=30.0)
    p.add_argument("--rq-cap", type=float, default=60.0)
    args = p.parse_args(argv)
    own, children, model = OwnRedis().start(), Children(), FakeOpenAI().start()
    conn = own.client()
    try:
        kill = [reclaim_once(children, own, conn, signal.SIGKILL) for _ in range(args.trials)]
        stop = [reclaim_once(children, own, conn, signal.SIGSTOP) for _ in range(args.trials)]
        rq = rq_reclaim(children, own, conn, args.rq_cap)
        renew = {"lease_20s_default": renewal_cost(children, own, conn, model, args.window, None),
                 "lease_120s_before": renewal_cost(children, own, conn, model, args.window, 120.0),
                 "plain_rq": rq_running_cost(children, own, conn, args.window)}
    finally:
        children.cleanup()
        model.stop()
        own.close()
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "root": ROOT.name,
        "reclaim_after_sigkill_s": {"median": statistics.median(kill), "max": max(kill), "all": kill},
        "reclaim_after_sigstop_s": {"median": statistics.median(stop), "max": max(stop), "all": stop},
        "plain_rq_leaves_started_after_sigkill_s": rq if rq is not None else f"> {args.rq_cap:g}",
        "running_job_per_minute": renew,
    }
    print(f"reclaim after SIGKILL (defaults): median {result['reclaim_after_sigkill_s']['median']} s, "
          f"max {max(kill)} s; after SIGSTOP: median {result['reclaim_after_sigstop_s']['median']} s, "
          f"max {max(stop)} s; plain RQ: {result['plain_rq_leaves_started_after_sigkill_s']}")
    for name, row in renew.items():
        print(f"{name:<20} " + ", ".join(f"{k} {v}" for k, v in row.items()))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
