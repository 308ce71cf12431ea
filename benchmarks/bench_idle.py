"""What waiting costs: Redis commands per second of idle leash workers while jobs queue, and
how soon a job deleted behind leash's back is recorded failed.

    python benchmarks/bench_idle.py [--sizes 1000,10000,100000] [--owners 100] [--window 30]
                                 [--checkout DIR]

For each size: that many jobs are enqueued (through ``jobs.enqueue``, ``--owners`` owners, the
default per-owner limit) on a queue no worker serves, so the two ``leash worker`` processes
(with their retry scheduler, default lease and reaper tick) stay idle while they wait. After
the workers' first sweeps have seen everything, ``INFO commandstats`` is reset and read again
after ``--window`` seconds (counting starts once the one-time indexing of jobs enqueued before
any worker ran is done): every command Redis ran in the window (the workers' dequeue
polls, heartbeats, schedulers and consistency sweeps), per second. Then one waiting job is
deleted with RQ's ``job.delete()`` (rq-dashboard's Delete) and the queue is emptied with
RQ's ``Queue.empty()`` (``rq empty``): seconds until leash records each deleted job failed.
``--checkout`` runs the workers from another checkout of leash (an earlier release, to
compare). A Redis of its own on a free loopback port; every process is killed by pid.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from benchlib import Children, OwnRedis, commandstats, wait_until, worker_env
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.enqueue import enqueue

PARKED = "parked"  # the queue the jobs wait on; the workers serve only "leash"
QUEUES = f"leash,{PARKED}"


def fill(conn, n: int, owners: int) -> None:
    started = time.monotonic()
    for i in range(n):
        enqueue(conn, "noop", {}, owner=f"owner-{i % owners}", queue=PARKED)
        if i and i % 20000 == 0:
            print(f"  enqueued {i} of {n} ({time.monotonic() - started:.0f} s)", file=sys.stderr)


def failed_within(conn, job_ids: list[str], timeout: float) -> float | None:
    started = time.monotonic()
    pending = set(job_ids)

    def all_failed():
        with conn.pipeline(transaction=False) as pipe:
            for job_id in pending:
                pipe.hget(keys.job(job_id), "state")
            states = pipe.execute()
        for job_id, state in zip(list(pending), states, strict=True):
            if state == b"failed":
                pending.discard(job_id)
        return not pending

    return round(time.monotonic() - started, 2) if wait_until(all_failed, timeout, interval=0.1) else None


def one_size(children: Children, own: OwnRedis, conn, n: int, args) -> dict:
    conn.flushdb()
    fill(conn, n, args.owners)
    env = worker_env(own.url, LEASH_QUEUE=QUEUES)
    argv = [sys.executable, "-m", "cli", "worker", "--queue", "leash", "--log-level", "WARNING"]
    workers = [children.start(argv, env, root=args.checkout) for _ in range(2)]
    # Jobs enqueued before any worker ran are indexed once by the workers' reaper (a one-time
    # step of every store, jobs.state_index.backfill_step): not part of waiting's cost.
    if not wait_until(lambda: conn.exists(keys.STATE_INDEX_READY), args.timeout * 5, interval=0.5):
        raise RuntimeError("the workers did not finish the one-time state indexing")
    time.sleep(args.settle)  # the first sweeps: every owner and queue seen once
    conn.config_resetstat()
    time.sleep(args.window)
    stats = commandstats(conn)
    stats.pop("config|resetstat", None)
    stats.pop("info", None)
    total = sum(stats.values())
    result = {"queued": n, "commands_per_s": round(total / args.window, 1),
              "top": {k: round(v / args.window, 1) for k, v in stats.most_common(6)}}

    waiting = [j.decode() for j in conn.zrange(keys.ACTIVE, n // 2, n // 2)]
    Job.fetch(waiting[0], connection=conn, serializer=JSONSerializer).delete()
    result["delete_to_failed_s"] = failed_within(conn, waiting, args.timeout)
    emptied = [j.decode() for j in conn.lrange(keys.rq_queue(PARKED), 0, -1)]
    Queue(PARKED, connection=conn).empty()
    result["emptied"] = len(emptied)
    result["empty_to_failed_s"] = failed_within(conn, emptied, args.timeout)
    for proc in workers:
        children.signal_tree(proc, signal.SIGKILL)
        proc.wait(timeout=10)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--owners", type=int, default=100)
    parser.add_argument("--window", type=float, default=30.0, help="seconds of idle counted")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds before counting starts")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up waiting for a failure after this")
    parser.add_argument("--checkout", default=None, help="run the workers from this checkout of leash")
    args = parser.parse_args()
    from benchlib import ROOT

    args.checkout = args.checkout or ROOT
    os.environ.update(LEASH_IMPORTS="benchmarks.chaos_kinds", LEASH_QUEUE=QUEUES)
    import benchmarks.chaos_kinds  # noqa: F401  (registers the no-op kind in this process)

    own = OwnRedis().start()
    children = Children()
    conn = own.client()
    results = []
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            results.append(one_size(children, own, conn, n, args))
            r = results[-1]
            print(f"{r['queued']:>7} queued: {r['commands_per_s']:>8} Redis commands/s idle "
                  f"(top: {', '.join(f'{k} {v}' for k, v in r['top'].items())}); job.delete() → failed in "
                  f"{r['delete_to_failed_s']} s; rq empty of {r['emptied']} → all failed in {r['empty_to_failed_s']} s",
                  flush=True)
    finally:
        children.cleanup()
        own.stop()
        own.close()
    if len(results) > 1:
        print(f"idle cost at {results[-1]['queued']} queued / at {results[0]['queued']}: "
              f"{results[-1]['commands_per_s'] / max(results[0]['commands_per_s'], 0.1):.2f}×")
    print(json.dumps({"bench": "idle", "owners": args.owners, "window_s": args.window, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
