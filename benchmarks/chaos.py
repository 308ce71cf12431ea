"""Proof under fire: run real jobs on real workers while killing, stopping and restarting
things, then check that nothing was lost, doubled or left wrongly running.

    python benchmarks/chaos.py [--quick] [--seed N] [--plot docs/chaos-states.png]

It starts its own Redis (``appendonly yes``, loopback, free port, scratch directory) and 4
``leash worker`` processes, enqueues jobs of kind ``chaos_classify`` (the offline
``classify`` kind with per-item latency, plus a ``notify`` side effect run through
``ctx.once``) and a few ``chaos_fail`` jobs that raise on every attempt. As jobs complete,
disruptions fire in a seeded random order:

    sigkill        SIGKILL a busy worker and its work-horse; a replacement starts
    sigterm        SIGTERM a busy worker and its children (a deploy); a replacement starts
    sigstop        SIGSTOP a busy worker past its lease, SIGCONT it later (a zombie)
    redis-restart  SIGTERM Redis, keep it down 2 s, start it again on the same port and
                   directory (AOF reload)

At the end every job is checked: ``chaos_classify`` succeeded with exactly ``total`` item
results and its side effect counted exactly once; ``chaos_fail`` failed with its error
stored; nothing running or stale; attempts never above max; every worker alive that we did
not stop. Reclaim latency is measured from the kill (or stop) to the moment the job is
running again under a new attempt. Exit status 1 on any violation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import time
from datetime import UTC, datetime

from benchlib import Children, OwnRedis, worker_env

from benchmarks.chaos_kinds import notify_key
from jobs import keys
from jobs.enqueue import enqueue

LABELS = ["positive", "negative", "question", "bug"]
WORDS = ["great", "slow", "refund", "how", "crash", "thanks", "why", "love", "broken", "ok"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="40 jobs x 10 items, one of each disruption")
    p.add_argument("--jobs", type=int)
    p.add_argument("--items", type=int)
    p.add_argument("--fail-jobs", type=int)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--lease", type=float, default=3.0, help="LEASH_LEASE_SECONDS for the workers")
    p.add_argument("--delay-ms", type=int, help="per-item latency (LEASH_LOCAL_DELAY_MS)")
    p.add_argument("--item-concurrency", type=int, default=4, help="LEASH_ITEM_CONCURRENCY for the workers")
    p.add_argument("--redis-down", type=float, default=2.0, help="seconds Redis stays down in its restart")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--plot", help="write a PNG of job states over time here")
    p.add_argument("--time-limit", type=float, help="give up (a violation) after this many seconds")
    args = p.parse_args(argv)
    # Jobs last about as long as when items ran one at a time (quick 2 s, full 1.2 s), so the
    # disruptions still land mid-job: items x delay / item concurrency.
    quick = dict(jobs=40, items=20, fail_jobs=2, delay_ms=400, time_limit=110,
                 disruptions=["sigkill", "sigterm", "sigstop", "redis-restart"])
    full = dict(jobs=200, items=20, fail_jobs=6, delay_ms=240, time_limit=600,
                disruptions=["sigkill"] * 3 + ["sigterm"] * 2 + ["sigstop"] * 2 + ["redis-restart"])
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**6)
    return args


class Chaos:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.redis = OwnRedis(appendonly=True)
        self.children = Children()
        self.workers: dict[str, object] = {}  # name -> Popen, live ones only
        self.expected_exits: set[int] = set()
        self.stopped: dict[str, float] = {}  # name -> when to SIGCONT
        self.terminating: dict[str, tuple[object, float]] = {}  # name -> (proc, signalled at)
        self.serial = 0
        self.violations: list[str] = []
        self.events: list[dict] = []
        self.samples: list[dict] = []
        self.tracked: list[dict] = []  # jobs whose attempt a disruption ended
        self.job_ids: list[str] = []
        self.fail_ids: set[str] = set()
        self.t0 = 0.0

    # --- processes -------------------------------------------------------------------

    def env(self) -> dict:
        return worker_env(self.redis.url, LEASH_LEASE_SECONDS=str(self.args.lease),
                          LEASH_LOCAL_DELAY_MS=str(self.args.delay_ms), LEASH_RETRY_BACKOFF="1",
                          LEASH_ITEM_CONCURRENCY=str(self.args.item_concurrency),
                          LEASH_HANDOFF_GRACE="10", LEASH_LOG_LEVEL="WARNING")

    def start_worker(self) -> str:
        self.serial += 1
        name = f"chaos-w{self.serial}"
        log = open(self.redis.dir / f"{name}.log", "wb")
        self.workers[name] = self.children.start(
            [sys.executable, "-m", "cli", "worker", "--name", name], self.env(),
            stdout=log, stderr=log)
        return name

    def busy_workers(self, conn) -> dict[str, tuple[str, str, float]]:
        """Live, not-stopped workers holding a running job: name -> (job id, token, lease expiry)."""
        running = [r.decode() for r in conn.zrange(keys.LEASES, 0, -1)]
        busy = {}
        for job_id in running:
            state, worker, token, expires = conn.hmget(keys.job(job_id), "state", "worker", "token", "lease_expires_at")
            if state == b"running" and worker and worker.decode() in self.workers:
                name = worker.decode()
                if name not in self.stopped and name not in self.terminating:
                    busy[name] = (job_id, token.decode(), float(expires))
        return busy

    # --- disruptions -------------------------------------------------------------------

    def disrupt(self, kind: str, conn) -> None:
        now = self.clock()
        if kind == "redis-restart":
            down = self.redis.restart(down_seconds=self.args.redis_down)
            self.events.append({"kind": kind, "t": round(now, 2), "down_s": round(down, 2)})
            return
        busy = self.busy_workers(conn)
        name = self.rng.choice(sorted(busy)) if busy else self.rng.choice(sorted(self.workers))
        proc = self.workers[name]
        held = busy.get(name)
        event = {"kind": kind, "t": round(now, 2), "worker": name, "job": held[0] if held else None}
        if kind == "sigkill":
            self.expected_exits.add(proc.pid)
            self.children.signal_tree(proc, signal.SIGKILL)
            del self.workers[name]
            self.start_worker()
        elif kind == "sigterm":
            self.expected_exits.add(proc.pid)
            self.children.signal_tree(proc, signal.SIGTERM)  # as Heroku does: every process
            self.terminating[name] = (proc, now)
            del self.workers[name]
            self.start_worker()
        elif kind == "sigstop":
            self.children.signal_tree(proc, signal.SIGSTOP)
            self.stopped[name] = now + self.args.lease + 2.5
        if held:
            self.tracked.append({"kind": kind, "job": held[0], "token": held[1], "at": now,
                                 "lease_left": round(held[2] - time.time(), 2), "recovered": None})
        self.events.append(event)

    def follow_up(self, conn) -> None:
        now = self.clock()
        for name, due in list(self.stopped.items()):
            if now >= due:
                self.children.signal_tree(self.workers[name], signal.SIGCONT)
                del self.stopped[name]
                self.events.append({"kind": "sigcont", "t": round(now, 2), "worker": name})
        for name, (proc, at) in list(self.terminating.items()):
            if proc.poll() is not None:
                self.events.append({"kind": "exited", "t": round(now, 2), "worker": name,
                                    "after_sigterm_s": round(now - at, 2)})
                del self.terminating[name]
            elif now - at > 30:
                self.violations.append(f"{name} did not exit within 30 s of SIGTERM")
                self.children.signal_tree(proc, signal.SIGKILL)
                del self.terminating[name]
        for name, proc in list(self.workers.items()):
            if proc.poll() is not None and proc.pid not in self.expected_exits:
                self.violations.append(f"worker {name} exited by itself (code {proc.returncode}) at {now:.1f}s")
                del self.workers[name]
                self.start_worker()
        for entry in self.tracked:
            if entry["recovered"] is None:
                state, token = conn.hmget(keys.job(entry["job"]), "state", "token")
                if token and token.decode() != entry["token"] and state in (b"running", b"succeeded", b"failed"):
                    entry["recovered"] = round(now - entry["at"], 2)
                elif token and token.decode() == entry["token"] and state in (b"succeeded", b"failed"):
                    # The attempt ended in the moment between picking the worker and the signal
                    # landing: nothing to recover (a dead process cannot finish under its token).
                    entry["recovered"] = "ended before the signal"

    # --- sampling and the end check ----------------------------------------------------------

    def sample(self, conn) -> dict:
        with conn.pipeline(transaction=False) as pipe:
            for job_id in self.job_ids:
                pipe.hmget(keys.job(job_id), "state", "lease_expires_at")
            rows = pipe.execute()
        wall = time.time()
        counts = dict.fromkeys(("queued", "running", "stale", "succeeded", "failed"), 0)
        for state, expires in rows:
            state = (state or b"queued").decode()
            if state == "running" and expires and float(expires) <= wall:
                state = "stale"
            counts[state] = counts.get(state, 0) + 1
        counts["t"] = round(self.clock(), 2)
        return counts

    def check(self, conn) -> dict:
        outcome = {"succeeded": 0, "failed_as_built": 0, "attempts_max_seen": 0, "reruns": 0}
        for job_id in self.job_ids:
            h = {k.decode(): v.decode() for k, v in conn.hgetall(keys.job(job_id)).items()}
            state, attempts, max_attempts = h.get("state"), int(h.get("attempts", 0)), int(h.get("max_attempts", 0))
            outcome["attempts_max_seen"] = max(outcome["attempts_max_seen"], attempts)
            outcome["reruns"] += max(0, attempts - 1)
            if attempts > max_attempts:
                self.violations.append(f"{job_id}: {attempts} attempts, above max {max_attempts}")
            if job_id in self.fail_ids:
                if state != "failed" or not h.get("error"):
                    self.violations.append(f"{job_id} (built to fail): state {state}, error {h.get('error')!r:.60}")
                else:
                    outcome["failed_as_built"] += 1
                continue
            total = int(h.get("total", -1))
            fields = sorted(int(k) for k in conn.hkeys(keys.items(job_id)))
            notified = int(conn.get(notify_key(job_id)) or 0)
            if state != "succeeded":
                self.violations.append(f"{job_id}: state {state}, error {h.get('error')!r:.120}")
                continue
            outcome["succeeded"] += 1
            if fields != list(range(total)) or int(h.get("done", -1)) != total:
                self.violations.append(f"{job_id}: {len(fields)} item results, done {h.get('done')}, total {total}")
            if notified != 1:
                self.violations.append(f"{job_id}: side effect ran {notified} times")
        leftover = conn.zcard(keys.LEASES)
        if leftover:
            self.violations.append(f"{leftover} leases left after the drain")
        outcome["rejected_writes"] = int(conn.get(keys.REJECTED_WRITES) or 0)
        outcome["reclaims"] = int(conn.get(keys.RECLAIMS) or 0)
        return outcome

    def clock(self) -> float:
        return time.monotonic() - self.t0

    # --- the run -------------------------------------------------------------------------

    def run(self) -> dict:
        a = self.args
        self.redis.start()
        os.environ.update(self.env())  # the enqueuer uses the same settings as the workers
        conn = self.redis.client()
        for _ in range(a.workers):
            self.start_worker()
        n_good = a.jobs - a.fail_jobs
        for i in range(a.jobs):
            items = [" ".join(self.rng.choices(WORDS, k=4)) + f" #{i}.{j}" for j in range(a.items)]
            kind = "chaos_fail" if i >= n_good else "chaos_classify"
            job_id, _ = enqueue(conn, kind, {"items": items, "labels": LABELS}, owner=f"owner-{i % 20}",
                                max_attempts=2 if kind == "chaos_fail" else 5)
            self.job_ids.append(job_id)
            if kind == "chaos_fail":
                self.fail_ids.add(job_id)
        self.t0 = time.monotonic()
        plan = list(a.disruptions)
        self.rng.shuffle(plan)
        thresholds = sorted(self.rng.uniform(0.05, 0.6) for _ in plan)
        spacing = a.lease + 1.0
        last_event = -spacing
        next_sample = 0.0
        drained_at = good_drained_at = None
        while True:
            now = self.clock()
            if now > a.time_limit:
                self.violations.append(f"not drained within the time limit ({a.time_limit:.0f} s)")
                break
            try:
                if now >= next_sample:
                    self.samples.append(self.sample(conn))
                    next_sample = now + 0.5
                    latest = self.samples[-1]
                    ended = latest["succeeded"] + latest["failed"]
                    if good_drained_at is None and latest["succeeded"] == n_good:
                        good_drained_at = now
                    if plan and ended >= thresholds[0] * a.jobs and now - last_event >= spacing:
                        thresholds.pop(0)
                        self.disrupt(plan.pop(0), conn)
                        last_event = self.clock()
                    if ended == a.jobs and not plan and not self.stopped:
                        drained_at = now
                        break
                self.follow_up(conn)
            except Exception as exc:  # Redis is restarting: keep the run going
                if not isinstance(exc, (ConnectionError, OSError)) and "redis" not in type(exc).__module__:
                    raise
            time.sleep(0.05)
        if plan:
            self.violations.append(f"disruptions not performed before the drain: {plan}")
        self.samples.append(self.sample(conn))
        self.stop_workers()
        outcome = self.check(conn)
        outcome["drain_s"] = round(drained_at, 1) if drained_at is not None else None
        outcome["good_jobs_drain_s"] = round(good_drained_at, 1) if good_drained_at is not None else None
        conn.close()
        return outcome

    def stop_workers(self) -> None:
        """Deploy-style stop at the end (SIGTERM, then they must exit) before the checks."""
        for name in list(self.stopped):
            self.children.signal_tree(self.workers[name], signal.SIGCONT)
        for proc in self.workers.values():
            self.expected_exits.add(proc.pid)
            proc.send_signal(signal.SIGTERM)
        for name, proc in self.workers.items():
            try:
                proc.wait(timeout=30)
            except Exception:
                self.violations.append(f"{name} did not exit within 30 s of the final SIGTERM")

    def close(self) -> None:
        self.children.cleanup()
        self.redis.close()


def spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"n": len(values), "min": min(values), "median": round(statistics.median(values), 2), "max": max(values)}


def main(argv=None) -> int:
    args = parse_args(argv)
    print(f"chaos: seed {args.seed}; {args.jobs} jobs x {args.items} items ({args.fail_jobs} built to fail), "
          f"{args.workers} workers, lease {args.lease:g} s, {args.delay_ms} ms per item, "
          f"{args.item_concurrency} items at once; "
          f"disruptions {', '.join(args.disruptions)}", flush=True)
    chaos = Chaos(args)
    load_before = os.getloadavg()
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("hard time limit")))
    signal.alarm(int(args.time_limit + 90))
    try:
        outcome = chaos.run()
    finally:
        signal.alarm(0)
        logs = {name: (chaos.redis.dir / f"{name}.log") for name in [f"chaos-w{i}" for i in range(1, chaos.serial + 1)]}
        crashed = [v.split()[1] for v in chaos.violations if "exited by itself" in v]
        for name in crashed:
            if logs.get(name) and logs[name].exists():
                print(f"--- last lines of {name}'s log ---\n" + "\n".join(logs[name].read_text().splitlines()[-15:]))
        chaos.close()
    by_kind = {}
    for entry in chaos.tracked:
        if isinstance(entry["recovered"], float | int):
            by_kind.setdefault(entry["kind"], []).append(entry["recovered"])
        elif entry["recovered"] is None:
            chaos.violations.append(f"{entry['job']} never ran again after {entry['kind']}")
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "seed": args.seed, "jobs": args.jobs, "items": args.items, "fail_jobs": args.fail_jobs,
        "workers": args.workers, "lease_s": args.lease, "delay_ms": args.delay_ms,
        "item_concurrency": args.item_concurrency,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        **outcome,
        "reclaim_after_sigkill_s": spread(by_kind.get("sigkill", [])),
        "reclaim_after_sigstop_s": spread(by_kind.get("sigstop", [])),
        "handoff_after_sigterm_s": spread(by_kind.get("sigterm", [])),
        "events": chaos.events,
        "violations": chaos.violations,
    }
    for event in chaos.events:
        print(f"  {event['t']:7.2f}s  {event['kind']:<14} " + ", ".join(
            f"{k}={v}" for k, v in event.items() if k not in ("t", "kind")))
    print(f"drain: {outcome['drain_s']} s (chaos_classify jobs all succeeded at {outcome['good_jobs_drain_s']} s); succeeded {outcome['succeeded']}/{args.jobs - args.fail_jobs}; "
          f"failed as built {outcome['failed_as_built']}/{args.fail_jobs}; max attempts seen "
          f"{outcome['attempts_max_seen']}; re-runs {outcome['reruns']}; reclaims {outcome['reclaims']}; "
          f"zombie writes rejected {outcome['rejected_writes']}")
    for label in ("reclaim_after_sigkill_s", "reclaim_after_sigstop_s", "handoff_after_sigterm_s"):
        print(f"{label}: {result[label]}")
    print("measured from the signal to the job running again under a new attempt")
    if args.plot and chaos.samples:
        from chaos_plot import plot_states

        plot_states(chaos.samples, chaos.events, args.plot,
                    f"leash chaos run: {args.jobs} jobs x {args.items} items, {args.workers} workers, "
                    f"lease {args.lease:g} s, seed {args.seed}")
        print(f"plot: {args.plot}")
    print("VIOLATIONS:\n  " + "\n  ".join(chaos.violations) if chaos.violations else "no violations")
    print(json.dumps(result))
    return 1 if chaos.violations else 0


if __name__ == "__main__":
    sys.exit(main())
