"""Many deploys in a row: does a ``leash worker`` always exit on SIGTERM?

    python benchmarks/deploy_trials.py [--trials 60] [--item-seconds 3] [--grace 20] [--seed N]

Each trial starts one ``leash worker`` (with RQ's retry scheduler, as the Procfile runs it)
on a Redis of the script's own, brings it to a moment, sends SIGTERM, and measures:

    target   group (honcho, a dyno stop: the whole process group) or main (the main process)
    moment   busy     mid-item of a ``classify`` job whose items take --item-seconds, after
                      the job has run a random 0-8 s (past the worker's periodic checks)
             between  a job of short items (50 ms), signalled 0.3-1.5 s in
             idle     no job: the worker waiting on its queue
             stuck    mid-item, with --stuck-grace shorter than the item: the work-horse
                      cannot reach a checkpoint in time, so the worker stops it itself

A trial passes when the worker exits with status 0 within its LEASH_HANDOFF_GRACE + 5 s, no
process it started is left, the scheduler lock is free, it started exactly one scheduler,
the job (if any) is queued with no attempt counted, the log has exactly one "handed back"
line for it and no ERROR and no traceback. A worker still running at grace + 5 s counts as hung and is
killed. Prints one line per trial and a summary; exit status 1 if any trial failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import redis
from benchlib import Children, OwnRedis, wait_until, worker_env

from jobs import keys
from jobs.core import states
from jobs.enqueue import enqueue

LOCK = keys.rq_scheduler_lock("leash")
VARIANTS = [(target, moment) for target in ("group", "main") for moment in ("busy", "between", "idle", "stuck")]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=60)
    p.add_argument("--item-seconds", type=float, default=3.0, help="per-item latency of busy trials")
    p.add_argument("--grace", type=float, default=20.0, help="LEASH_HANDOFF_GRACE for the workers")
    p.add_argument("--stuck-grace", type=float, default=1.0, help="LEASH_HANDOFF_GRACE of stuck trials")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", help="also write the trials here")
    return p.parse_args(argv)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def trial(redis_url: str, children: Children, target: str, moment: str, args, rng: random.Random,
          log_path: Path) -> dict:
    conn = redis.Redis.from_url(redis_url)
    conn.flushdb()
    delay_ms = 50 if moment == "between" else int(args.item_seconds * 1000)
    grace = args.stuck_grace if moment == "stuck" else args.grace
    env = worker_env(redis_url, LEASH_HANDOFF_GRACE=str(grace), LEASH_LOCAL_DELAY_MS=str(delay_ms),
                     LEASH_LEASE_SECONDS=str(max(30.0, 3 * args.item_seconds)),
                     LEASH_ITEM_CONCURRENCY="1")  # one item at a time: the signal lands mid-item
    with open(log_path, "wb") as out:
        worker = children.start([sys.executable, "-m", "cli", "worker", "--log-level", "INFO"], env,
                                stdout=out, stderr=subprocess.STDOUT)
    job_id = None
    if moment == "idle":
        wait_until(lambda: conn.get(LOCK) and "Listening on" in log_path.read_text(), 30)
        time.sleep(rng.uniform(0, 2))
    else:
        items = [f"item {i}" for i in range(40)]
        job_id, _ = enqueue(conn, "classify", {"items": items, "labels": ["a", "b"]})
        wait_until(lambda: conn.hget(keys.job(job_id), "state") == b"running", 30)
        pause = {"busy": (0, 8), "between": (0.3, 1.5), "stuck": (0, args.item_seconds - args.stuck_grace)}[moment]
        time.sleep(rng.uniform(*pause))
    family = [worker.pid, *children.descendants(worker.pid)]
    done_at_signal = int(conn.hget(keys.job(job_id), "done") or 0) if job_id else 0
    sent = time.monotonic()
    if target == "group":
        os.killpg(worker.pid, signal.SIGTERM)
    else:
        worker.send_signal(signal.SIGTERM)
    try:
        code = worker.wait(timeout=grace + 5)
    except subprocess.TimeoutExpired:
        code = None
    seconds = time.monotonic() - sent
    if code is None:
        children.signal_tree(worker, signal.SIGKILL)
        worker.wait()
    log_text = log_path.read_text(errors="replace")
    job = states.status(conn, job_id) if job_id else None
    result = {
        "target": target, "moment": moment, "grace": grace, "exit_code": code, "seconds": round(seconds, 2),
        "left_running": [pid for pid in family if alive(pid)],
        "lock_held": conn.get(LOCK) is not None,
        "schedulers_started": log_text.count("Scheduler for leash started"),
        "errors_logged": log_text.count(" ERROR ") + log_text.count("Traceback"),
        "handed_back_lines": log_text.count("handed back"),
        "job": job and {"state": job["state"], "attempts": job["attempts"], "done": job["done"],
                        "done_at_signal": done_at_signal},
    }
    problems = []
    if code is None:
        problems.append("hung")
    elif code != 0:
        problems.append(f"exit {code}")
    if result["left_running"]:
        problems.append("processes left")
    if result["lock_held"]:
        problems.append("scheduler lock held")
    if result["schedulers_started"] != 1:
        problems.append(f"{result['schedulers_started']} schedulers started")
    if result["errors_logged"]:
        problems.append("ERROR/traceback logged")
    if job and (job["state"] != "queued" or job["attempts"] != 0):
        problems.append(f"job {job['state']} attempts={job['attempts']}")
    if job and result["handed_back_lines"] != 1:
        problems.append(f"{result['handed_back_lines']} hand-off lines")
    result["problems"] = problems
    conn.close()
    return result


def summarise(results: list[dict], args) -> None:
    print()
    print(f"{'target':6} {'moment':8} {'grace':>5} {'trials':>6} {'passed':>6} {'hung':>4} "
          f"{'exit s: median':>14} {'p95':>6} {'max':>6}")
    for target, moment in VARIANTS:
        rows = [r for r in results if (r["target"], r["moment"]) == (target, moment)]
        if not rows:
            continue
        times = sorted(r["seconds"] for r in rows)
        p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
        print(f"{target:6} {moment:8} {rows[0]['grace']:5g} {len(rows):6} {sum(not r['problems'] for r in rows):6} "
              f"{sum('hung' in r['problems'] for r in rows):4} {statistics.median(times):14.2f} "
              f"{p95:6.2f} {times[-1]:6.2f}")
    failed = [r for r in results if r["problems"]]
    print(f"\n{len(results) - len(failed)} of {len(results)} trials passed (limit: grace + 5 s); "
          f"slowest exit {max(r['seconds'] for r in results):.2f} s")


def main(argv=None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed {seed}; {args.trials} trials; items {args.item_seconds:g} s (busy); grace {args.grace:g} s")
    redis_server = OwnRedis().start()
    children = Children()
    results = []
    logs = Path(tempfile.mkdtemp(prefix="leash-deploy-trials-"))
    try:
        for number in range(args.trials):
            target, moment = VARIANTS[number % len(VARIANTS)]
            result = trial(redis_server.url, children, target, moment, args, rng, logs / f"worker-{number}.log")
            results.append(result)
            print(f"{number:3} {target:5} {moment:7} exit={result['exit_code']} in {result['seconds']:5.2f} s "
                  f"{'ok' if not result['problems'] else 'FAILED: ' + ', '.join(result['problems'])}", flush=True)
    finally:
        children.cleanup()
        redis_server.close()
    summarise(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"seed": seed, "trials": results}, indent=1))
    failed = [r for r in results if r["problems"]]
    if failed:
        print(f"logs of failed trials: {logs}")
    else:
        for path in logs.iterdir():
            path.unlink()
        logs.rmdir()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
