"""leash against plain RQ 3.0, side by side, in one run on one Redis of its own.

    python benchmarks/bench_lifecycle.py [--jobs 500] [--rounds 3] [--rq-cap 120]

Measures:
  enqueue     seconds per enqueue: leash ``jobs.enqueue.enqueue`` vs ``rq.Queue.enqueue_call``
              of the same (kind, payload) with the JSON serializer; a middle column is RQ with
              the options leash passes (Retry + per-owner RateLimit + TTLs + meta), which
              splits the difference into "RQ features leash uses" and "leash's own writes".
  throughput  no-op jobs per second: ``leash worker --burst`` on kind ``noop`` vs ``rq worker
              --burst`` on a no-op function, the same number of jobs, median of the rounds.
              Measured from the first job's start to the last job's end (RQ's own timestamps
              on both sides), so process start-up is not counted.
  commands    per status read (``jobs.core.states.status``) and per heartbeat (``Attempt.heartbeat``),
              counted exactly with MONITOR: commands sent, commands run inside Lua, round trips.
  sweep       one consistency round (``jobs.core.upkeep.consistency.sweep``, run by a worker every reaper
              tick): seconds and round trips with ``--sweep-jobs`` queued jobs over 100 owners.
  reclaim     seconds from SIGKILL of a worker (main process and work-horse) until the job runs
              again (leash, lease 5 s) or leaves ``started`` (RQ defaults, capped).

Jobs are spread over 100 owners (5 jobs each), so leash's per-owner limit (2) is exercised.
Prints a table and one JSON line. Every process it starts is killed by pid at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import time
from datetime import UTC, datetime

from benchlib import Children, OwnRedis, count_commands, wait_until, worker_env
from rq import Queue, Retry
from rq.job import Job
from rq.rate_limit import RateLimit
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.core import lease, states
from jobs.enqueue import enqueue

PLAIN_NOOP = "benchmarks.plain_rq_jobs.noop"
PLAIN_SLEEP = "benchmarks.plain_rq_jobs.sleep"
OWNERS = 100


def owner(i: int) -> str:
    return f"user-{i % OWNERS}"


# --- enqueue ---------------------------------------------------------------------------


def time_enqueue(conn, n: int) -> dict[str, float]:
    """Seconds per enqueue for the three variants, each timed over ``n`` jobs."""
    from jobs.config import settings

    s = settings()
    plain = Queue("bench-plain", connection=conn, serializer=JSONSerializer)
    with_options = Queue("bench-rq-options", connection=conn, serializer=JSONSerializer)

    def run_plain():
        for _i in range(n):
            plain.enqueue_call(PLAIN_NOOP, args=("noop", {}))

    def run_rq_options():
        for i in range(n):
            with_options.enqueue_call(
                PLAIN_NOOP, args=("noop", {}), timeout=s.job_timeout, result_ttl=s.result_ttl,
                failure_ttl=s.result_ttl, retry=Retry(max=s.max_attempts - 1, interval=s.retry_backoff),
                rate_limit=RateLimit(f"bench-owner:{owner(i)}", s.owner_concurrency),
                description=f"noop (0 items) for {owner(i)}", meta={"leash_kind": "noop", "leash_owner": owner(i)},
            )

    def run_leash():
        for i in range(n):
            enqueue(conn, "noop", {}, owner=owner(i))

    out = {}
    for name, fn in (("rq", run_plain), ("rq_with_leash_options", run_rq_options), ("leash", run_leash)):
        conn.flushdb()
        began = time.perf_counter()
        fn()
        out[name] = (time.perf_counter() - began) / n
    conn.flushdb()
    return out


def enqueue_commands(url: str, conn) -> dict[str, dict]:
    plain = Queue("bench-plain", connection=conn, serializer=JSONSerializer)
    n = 20
    # Warm up connections and script caches so only steady-state costs are counted.
    plain.enqueue_call(PLAIN_NOOP, args=("noop", {}))
    for i in range(OWNERS):
        enqueue(conn, "noop", {}, owner=owner(i))
    rq_count = count_commands(url, lambda: [plain.enqueue_call(PLAIN_NOOP, args=("noop", {})) for _ in range(n)])
    leash_count = count_commands(url, lambda: [enqueue(conn, "noop", {}, owner=owner(i)) for i in range(n)])
    conn.flushdb()
    return {"rq": rq_count.per(n), "leash": leash_count.per(n)}


# --- throughput ------------------------------------------------------------------------


def job_span(conn, ids: list[str]) -> float:
    """Seconds from the first job's start to the last job's end, from RQ's job hashes."""
    jobs = [j for j in Job.fetch_many(ids, connection=conn, serializer=JSONSerializer) if j is not None]
    starts = [j.started_at for j in jobs if j.started_at]
    ends = [j.ended_at for j in jobs if j.ended_at]
    if len(ends) != len(ids):
        raise RuntimeError(f"only {len(ends)} of {len(ids)} jobs ended")
    return (max(ends) - min(starts)).total_seconds()


def run_burst(children: Children, argv: list[str], env: dict, timeout: float) -> float:
    began = time.monotonic()
    proc = children.start(argv, env, stdout=subprocess_devnull(), stderr=subprocess_devnull())
    try:
        proc.wait(timeout=timeout)
    except Exception:
        children.signal_tree(proc, signal.SIGKILL)
        raise RuntimeError(f"{argv[2:4]} did not drain within {timeout}s") from None
    return time.monotonic() - began


def subprocess_devnull():
    return open(os.devnull, "wb")


def throughput_round(children: Children, own: OwnRedis, conn, n: int, leash_first: bool) -> dict[str, dict]:
    env = worker_env(own.url)
    results = {}

    def leash_side():
        conn.flushdb()
        ids = [enqueue(conn, "noop", {}, owner=owner(i))[0] for i in range(n)]
        wall = run_burst(children, [sys.executable, "-m", "cli", "worker", "--burst",
                                    "--log-level", "WARNING"], env, timeout=300)
        ok = sum(1 for i in ids if conn.hget(keys.job(i), "state") == b"succeeded")
        if ok != n:
            raise RuntimeError(f"leash: only {ok} of {n} no-op jobs succeeded")
        results["leash"] = {"span": job_span(conn, ids), "wall": wall}

    def rq_side():
        conn.flushdb()
        q = Queue("bench-plain", connection=conn, serializer=JSONSerializer)
        ids = [q.enqueue_call(PLAIN_NOOP, args=("noop", {})).id for _ in range(n)]
        wall = run_burst(children, [sys.executable, "-m", "rq.cli", "worker", "--burst", "-q", "-S", "json",
                                    "-u", own.url, "bench-plain"], env, timeout=300)
        results["rq"] = {"span": job_span(conn, ids), "wall": wall}

    for side in ((leash_side, rq_side) if leash_first else (rq_side, leash_side)):
        side()
    conn.flushdb()
    return results


def sweep_cost(url: str, conn, n: int) -> dict:
    """One consistency sweep over ``n`` queued jobs (the reaper's per-tick check against RQ's
    tools), after the lazy clean-up of jobs that ended (a first round)."""
    from jobs.core.upkeep import consistency

    conn.flushdb()
    for i in range(n):
        enqueue(conn, "noop", {}, owner=owner(i))
    consistency.sweep(conn)
    started = time.perf_counter()
    consistency.sweep(conn)
    seconds = time.perf_counter() - started
    counted = count_commands(url, lambda: consistency.sweep(conn))
    conn.flushdb()
    return {"jobs": n, "ms": round(seconds * 1000, 1), "round_trips": counted.per(1)["round_trips"],
            "commands": counted.per(1)["commands_total"]}


# --- commands per status read and per heartbeat -----------------------------------------


def read_and_heartbeat_commands(url: str, conn) -> dict[str, dict]:
    n = 50
    job_id, _ = enqueue(conn, "noop", {}, owner="probe")
    states.status(conn, job_id)
    status_count = count_commands(url, lambda: [states.status(conn, job_id) for _ in range(n)])
    rq_status = count_commands(
        url, lambda: [Job.fetch(job_id, connection=conn, serializer=JSONSerializer).get_status(refresh=False)
                      for _ in range(n)])

    attempt = lease.claim(conn, job_id, "leash", "bench-worker")
    attempt.rq_started_member = f"{job_id}:bench-execution"  # as a real worker sets it
    attempt.heartbeat(done=0, total=n)
    progress = count_commands(url, lambda: [attempt.heartbeat(done=i) for i in range(n)])
    checkpoint = count_commands(url, lambda: [attempt.heartbeat(item=(i, '"label"')) for i in range(n)])
    conn.flushdb()
    return {
        "status_read": status_count.per(n),
        "rq_fetch_status": rq_status.per(n),
        "heartbeat_progress": progress.per(n),
        "heartbeat_checkpoint": checkpoint.per(n),
    }


# --- reclaim after SIGKILL ---------------------------------------------------------------


def leash_reclaim(children: Children, own: OwnRedis, conn, lease_seconds: float) -> float:
    conn.flushdb()
    env = worker_env(own.url, LEASH_LEASE_SECONDS=str(lease_seconds), LEASH_LOCAL_DELAY_MS="300")
    procs = {}
    for name in ("reclaim-a", "reclaim-b"):
        procs[name] = children.start([sys.executable, "-m", "cli", "worker", "--name", name,
                                      "--log-level", "ERROR"], env)
    items = [f"item {i}" for i in range(60)]
    job_id, _ = enqueue(conn, "classify", {"items": items, "labels": ["a", "b"]})
    holder = wait_until(lambda: int(conn.hget(keys.job(job_id), "done") or 0) >= 2
                        and conn.hget(keys.job(job_id), "worker"), 60)
    if not holder:
        raise RuntimeError("leash reclaim: the job never started")
    children.signal_tree(procs[holder.decode()], signal.SIGKILL)
    killed = time.monotonic()
    again = wait_until(lambda: conn.hget(keys.job(job_id), "attempts") == b"2"
                       and conn.hget(keys.job(job_id), "state") == b"running", 60)
    if not again:
        raise RuntimeError("leash reclaim: the job did not run again within 60 s")
    seconds = time.monotonic() - killed
    for proc in procs.values():
        children.signal_tree(proc, signal.SIGKILL)
    conn.flushdb()
    return seconds


def rq_reclaim(children: Children, own: OwnRedis, conn, cap: float) -> float | None:
    conn.flushdb()
    env = worker_env(own.url)
    procs = {}
    for name in ("rq-a", "rq-b"):
        procs[name] = children.start([sys.executable, "-m", "rq.cli", "worker", "-q", "-S", "json", "-n", name,
                                      "-u", own.url, "bench-rq"], env)
    q = Queue("bench-rq", connection=conn, serializer=JSONSerializer)
    job = q.enqueue_call(PLAIN_SLEEP, args=("sleep", {"seconds": 3600}), retry=Retry(max=1), timeout=7200)

    def started_on():
        job.refresh()
        return job.get_status(refresh=False) == "started" and job.worker_name

    holder = wait_until(started_on, 60)
    if not holder:
        raise RuntimeError("rq reclaim: the job never started")
    children.signal_tree(procs[holder], signal.SIGKILL)
    killed = time.monotonic()
    # Poll the job hash only: registry listings would run RQ's cleanup and distort the result.
    left = wait_until(lambda: job.get_status(refresh=True) != "started", cap, interval=0.5)
    seconds = time.monotonic() - killed if left else None
    for proc in procs.values():
        children.signal_tree(proc, signal.SIGKILL)
    conn.flushdb()
    return seconds


# --- report ------------------------------------------------------------------------------


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rq-cap", type=float, default=120.0, help="seconds to wait for RQ's reclaim")
    parser.add_argument("--lease", type=float, default=5.0, help="leash lease seconds for the reclaim test")
    parser.add_argument("--sweep-jobs", type=int, default=2000, help="queued jobs for the sweep measurement")
    parser.add_argument("--time-limit", type=float, default=1200.0, help="abort the whole run after this")
    args = parser.parse_args()

    os.environ["LEASH_IMPORTS"] = "benchmarks.chaos_kinds"
    import benchmarks.chaos_kinds  # noqa: F401  (registers the no-op kind in this process)

    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("time limit reached")))
    signal.alarm(int(args.time_limit))
    own = OwnRedis().start()
    children = Children()
    conn = own.client()
    load_before = os.getloadavg()
    try:
        enqueue_rounds = [time_enqueue(conn, args.jobs) for _ in range(args.rounds)]
        enq = {k: statistics.median(r[k] for r in enqueue_rounds) for k in enqueue_rounds[0]}
        enq_cmds = enqueue_commands(own.url, conn)
        rounds = [throughput_round(children, own, conn, args.jobs, leash_first=(i % 2 == 0))
                  for i in range(args.rounds)]
        tput = {side: args.jobs / statistics.median(r[side]["span"] for r in rounds) for side in ("leash", "rq")}
        wall = {side: statistics.median(r[side]["wall"] for r in rounds) for side in ("leash", "rq")}
        cmds = read_and_heartbeat_commands(own.url, conn)
        sweep = sweep_cost(own.url, conn, args.sweep_jobs)
        leash_reclaim_s = leash_reclaim(children, own, conn, args.lease)
        rq_reclaim_s = rq_reclaim(children, own, conn, args.rq_cap)
    finally:
        signal.alarm(0)
        children.cleanup()
        conn.close()
        own.close()
    load_after = os.getloadavg()

    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "jobs": args.jobs, "rounds": args.rounds,
        "enqueue_ms": {k: round(v * 1000, 3) for k, v in enq.items()},
        "enqueue_ratio": ratio(enq["leash"], enq["rq"]),
        "enqueue_commands": enq_cmds,
        "throughput_jobs_per_s": {k: round(v, 1) for k, v in tput.items()},
        "throughput_ratio": ratio(tput["leash"], tput["rq"]),
        "burst_wall_s": {k: round(v, 2) for k, v in wall.items()},
        "commands": cmds,
        "sweep": sweep,
        "reclaim_s": {"leash": round(leash_reclaim_s, 2), "leash_lease_s": args.lease,
                      "rq": round(rq_reclaim_s, 2) if rq_reclaim_s is not None else None, "rq_cap_s": args.rq_cap},
    }
    rq_reclaim_text = f"{rq_reclaim_s:.1f}" if rq_reclaim_s is not None else f"> {args.rq_cap:.0f} (cap)"
    rows = [
        ("enqueue, ms/job", f"{enq['leash'] * 1000:.3f}", f"{enq['rq'] * 1000:.3f}",
         f"{result['enqueue_ratio']:.2f} (goal <= 1.3)"),
        ("  RQ with leash's options (Retry+RateLimit)", "", f"{enq['rq_with_leash_options'] * 1000:.3f}",
         f"{ratio(enq['rq_with_leash_options'], enq['rq']):.2f} of plain RQ"),
        ("enqueue, commands sent/round trips", f"{enq_cmds['leash']['commands_sent']}/{enq_cmds['leash']['round_trips']}",
         f"{enq_cmds['rq']['commands_sent']}/{enq_cmds['rq']['round_trips']}", ""),
        ("no-op throughput, jobs/s", f"{tput['leash']:.1f}", f"{tput['rq']:.1f}",
         f"{result['throughput_ratio']:.2f} (goal >= 0.8)"),
        ("status read: round trips / commands", f"{cmds['status_read']['round_trips']} / {cmds['status_read']['commands_total']}",
         f"{cmds['rq_fetch_status']['round_trips']} / {cmds['rq_fetch_status']['commands_total']}", "RQ: Job.fetch"),
        ("heartbeat (progress): trips / sent / in Lua", f"{cmds['heartbeat_progress']['round_trips']} / "
         f"{cmds['heartbeat_progress']['commands_sent']} / {cmds['heartbeat_progress']['commands_in_lua']}", "n/a",
         "RQ has no job heartbeat"),
        ("heartbeat (checkpoint): trips / sent / in Lua", f"{cmds['heartbeat_checkpoint']['round_trips']} / "
         f"{cmds['heartbeat_checkpoint']['commands_sent']} / {cmds['heartbeat_checkpoint']['commands_in_lua']}", "n/a", ""),
        (f"consistency sweep, {sweep['jobs']} queued jobs", f"{sweep['ms']} ms, {sweep['round_trips']} trips",
         "n/a", f"{sweep['commands']} commands, once per reaper tick"),
        ("reclaim after SIGKILL, s", f"{leash_reclaim_s:.1f} (lease {args.lease:g} s)", rq_reclaim_text,
         "RQ worst case ~900 s"),
    ]
    print(f"leash vs RQ 3.0 — {args.jobs} jobs, {args.rounds} rounds — {result['machine']} — "
          f"load {load_before[0]:.2f} -> {load_after[0]:.2f}")
    print(f"{'':48} {'leash':>26} {'RQ':>16}   note")
    for name, a, b, note in rows:
        print(f"{name:48} {a:>26} {b:>16}   {note}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
