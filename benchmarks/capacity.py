"""What one job costs Redis over its whole life, measured, and what one Redis can carry.

    python benchmarks/capacity.py [--jobs 200] [--items 20] [--workers 2]

On a Redis of its own (appendonly yes, appendfsync everysec, as in production) it measures,
with INFO commandstats and INFO cpu (Redis main-thread CPU) deltas:

  enqueue     ``jobs.enqueue.enqueue`` of a classify job
  run         claim, one checkpoint per item, finish, RQ's bookkeeping — everything workers
              do between dequeue and the next job (worker start-up amortised over the jobs)
  idle        what a waiting worker costs per second (blocking dequeue, heartbeats, reaper)
  poll        one status read (``jobs.core.states.status``)

then runs ``redis-benchmark`` for the raw ceiling of this Redis (GET, and the heartbeat Lua
script itself) and turns it all into a capacity table. Prints the table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime

from benchlib import Children, OwnRedis, commandstats, wait_until, worker_env

from jobs import keys
from jobs.core import lease, states
from jobs.enqueue import enqueue
from jobs.lifecycle import scripts as lua_scripts

TARGET_CPU = 0.7  # plan for 70 % of Redis' one main thread
LABELS = ["positive", "negative", "question", "bug"]


def cpu(client) -> float:
    info = client.info("cpu")
    return info["used_cpu_user_main_thread"] + info["used_cpu_sys_main_thread"]


def measure(client, fn):
    """(commands, Redis main-thread CPU seconds, wall seconds) spent while ``fn`` runs."""
    before_cmds, before_cpu, began = commandstats(client), cpu(client), time.monotonic()
    fn()
    wall = time.monotonic() - began
    after_cmds, after_cpu = commandstats(client), cpu(client)
    delta = after_cmds - before_cmds
    delta.pop("info", None)
    return delta, after_cpu - before_cpu, wall


def per(delta, cpu_s, n) -> dict:
    return {"commands": round(sum(delta.values()) / n, 1), "cpu_us": round(cpu_s / n * 1e6, 1),
            "top": {k: round(v / n, 2) for k, v in delta.most_common(8)}}


def redis_benchmark(port: int, command: list[str], requests: int = 100_000) -> float | None:
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return None
    out = subprocess.run([binary, "-h", "127.0.0.1", "-p", str(port), "-c", "50", "-n", str(requests), "-q", *command],
                         capture_output=True, text=True, timeout=120).stdout
    found = re.findall(r"([\d.]+) requests per second", out)
    return float(found[-1]) if found else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--items", type=int, default=20)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--idle-seconds", type=float, default=20.0)
    args = p.parse_args()
    os.environ["LEASH_IMPORTS"] = "benchmarks.chaos_kinds"
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("time limit")))
    signal.alarm(900)
    own = OwnRedis(appendonly=True).start()
    client = own.client()
    client.config_set("appendfsync", "everysec")
    children = Children()
    load_before = os.getloadavg()
    try:
        baseline_clients = client.info("clients")["connected_clients"]
        ids: list[str] = []

        def do_enqueue():
            for i in range(args.jobs):
                items = [f"item {i}.{j} great refund why" for j in range(args.items)]
                ids.append(enqueue(client, "classify", {"items": items, "labels": LABELS}, owner=f"user-{i % 50}")[0])

        # Redis' own housekeeping (serverCron, AOF) with no client at all, per second.
        quiet = measure(client, lambda: time.sleep(args.idle_seconds / 2))
        quiet_cpu_per_s = quiet[1] / quiet[2]
        enq = measure(client, do_enqueue)
        env = worker_env(own.url, LEASH_LOCAL_DELAY_MS="0")
        procs = []

        def do_run():
            for _i in range(args.workers):
                procs.append(children.start([sys.executable, "-m", "cli", "worker", "--log-level", "WARNING"], env))
            # One HGET per round on the outcome totals, so watching costs next to nothing.
            done = wait_until(lambda: int(client.hget(keys.STATS_TOTALS, "succeeded:classify") or 0) >= len(ids),
                              600, interval=0.5)
            if not done:
                raise RuntimeError("the jobs did not all succeed")

        run = measure(client, do_run)
        run = (run[0], max(0.0, run[1] - quiet_cpu_per_s * run[2]), run[2])
        idle = measure(client, lambda: time.sleep(args.idle_seconds))
        per_worker_clients = (client.info("clients")["connected_clients"] - baseline_clients) / args.workers
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)
        polls = measure(client, lambda: [states.status(client, j) for j in ids for _ in range(5)])
        n_polls = len(ids) * 5

        # The heartbeat script itself under redis-benchmark: a running job, a valid token.
        job_id, _ = enqueue(client, "classify", {"items": ["x"], "labels": LABELS}, owner="bench")
        attempt = lease.claim(client, job_id, "leash", "bench")
        sha = client.script_load(lua_scripts.source("heartbeat_v4"))
        hb_keys = [keys.job(job_id), keys.LEASES, keys.items(job_id), keys.rq_job(job_id),
                   keys.rq_started("leash", client), keys.REJECTED_WRITES, keys.usage(job_id),
                   keys.usage_owner_day("bench", "2026-01-01"), keys.usage_model("bench"),
                   keys.owner_reservations("bench"), keys.owner_reservation_records("bench"),
                   keys.CACHE_INDEX, keys.CACHE_SIZES, keys.CACHE_BYTES]
        # One item's result and the lease renewed; no usage, no cache write.
        hb_args = [job_id, attempt.token, str(time.time()), "120", "", "", "0", '"bug"', "", "1",
                   "", "", "1", "3600", "3600", "", "0", "0"]
        get_ops = redis_benchmark(own.port, ["-t", "get"])
        hb_ops = redis_benchmark(own.port, ["evalsha", sha, str(len(hb_keys)), *hb_keys, *hb_args], 50_000)
    finally:
        signal.alarm(0)
        children.cleanup()
        client.close()
        own.close()

    # Watching for the end (one HGET per 0.5 s) is not the workers' cost.
    run_cmds = run[0].copy()
    run_cmds["hget"] = max(0, run_cmds["hget"] - int(run[2] / 0.5) - 1)
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "jobs": args.jobs, "items": args.items, "workers": args.workers,
        "enqueue": per(enq[0], enq[1], args.jobs),
        "run": per(run_cmds, run[1], args.jobs),
        "run_wall_s": round(run[2], 1),
        "idle_worker_per_s": per(idle[0], max(0.0, idle[1] - quiet_cpu_per_s * idle[2]), args.workers * idle[2]),
        "redis_housekeeping_cpu_us_per_s": round(quiet_cpu_per_s * 1e6, 1),
        "poll": per(polls[0], polls[1], n_polls),
        "connections_per_worker": per_worker_clients,
        "redis_benchmark_ops_per_s": {"get": get_ops, "heartbeat_lua": hb_ops},
    }
    result["table"] = capacity_table(result)
    print_report(result)
    print(json.dumps(result))
    return 0


def capacity_table(r: dict) -> list[dict]:
    """Workers and jobs/s one Redis carries at TARGET_CPU, for jobs of r['items'] items whose
    items take ``latency`` seconds each, each job watched by one client polling with backoff."""
    job_cpu = (r["enqueue"]["cpu_us"] + r["run"]["cpu_us"]) / 1e6
    job_cmds = r["enqueue"]["commands"] + r["run"]["commands"]
    rows = []
    for latency in (0.0, 0.1, 1.0, 5.0):
        duration = r["items"] * latency
        polls = min(duration, 10) + max(0.0, duration - 10) / 5 + 1
        per_job_cpu = job_cpu + polls * r["poll"]["cpu_us"] / 1e6
        per_job_cmds = job_cmds + polls * r["poll"]["commands"]
        # One busy worker finishes 1/duration jobs per second and ticks like an idle one.
        worker_cpu = r["idle_worker_per_s"]["cpu_us"] / 1e6
        if duration == 0:
            jobs_s = TARGET_CPU / per_job_cpu
            rows.append({"item_latency_s": latency, "job_s": 0, "polls_per_job": round(polls, 1),
                         "commands_per_job": round(per_job_cmds), "jobs_per_s": round(jobs_s),
                         "workers": None, "commands_per_s": round(jobs_s * per_job_cmds)})
            continue
        per_worker_cpu = per_job_cpu / duration + worker_cpu
        workers = TARGET_CPU / per_worker_cpu
        rows.append({"item_latency_s": latency, "job_s": duration, "polls_per_job": round(polls, 1),
                     "commands_per_job": round(per_job_cmds), "jobs_per_s": round(workers / duration, 1),
                     "workers": round(workers),
                     "commands_per_s": round(workers * (per_job_cmds / duration + r["idle_worker_per_s"]["commands"]))})
    return rows


def print_report(r: dict) -> None:
    print(f"leash capacity — {r['jobs']} jobs x {r['items']} items, {r['workers']} workers — {r['machine']} — "
          f"load {r['loadavg_before'][0]:.2f} -> {r['loadavg_after'][0]:.2f}")
    for name in ("enqueue", "run", "poll", "idle_worker_per_s"):
        print(f"  {name:18} {r[name]['commands']:7} commands  {r[name]['cpu_us']:8} us Redis CPU   {r[name]['top']}")
    print(f"  Redis housekeeping with no clients: {r['redis_housekeeping_cpu_us_per_s']} us CPU per second (not charged above)")
    print(f"  connections per worker: {r['connections_per_worker']}; redis-benchmark ops/s: {r['redis_benchmark_ops_per_s']}")
    print(f"  capacity at {TARGET_CPU:.0%} of Redis' main thread:")
    print(f"  {'item latency':>12} {'job length':>10} {'polls':>6} {'cmds/job':>9} {'workers':>8} {'jobs/s':>8} {'cmds/s':>8}")
    for row in r["table"]:
        print(f"  {row['item_latency_s']:>11}s {row['job_s']:>9}s {row['polls_per_job']:>6} {row['commands_per_job']:>9} "
              f"{row['workers'] if row['workers'] is not None else '-':>8} {row['jobs_per_s']:>8} {row['commands_per_s']:>8}")


if __name__ == "__main__":
    sys.exit(main())
