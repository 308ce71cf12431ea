"""What counting every token costs: Redis commands, round trips and items/s of one model job,
measured for two checkouts of leash in one run (before and after usage accounting).

    python benchmarks/bench_usage.py --tree before=../leash-before --tree after=. [--items 480]
        [--latency 0.2] [--concurrency 16] [--rounds 3]

Each ``--tree LABEL=PATH`` is a checkout of leash with its own virtualenv (``PATH/.venv``,
``pip install -e '.[test,bench]'``; without one this script's Python is used). For every tree
the job is submitted by that tree's own ``enqueue`` and run by that tree's own ``leash worker``
(its Python, PYTHONPATH=PATH), on a Redis of this script's own, against the tests' loopback
OpenAI-compatible server (``tests/fake_openai.py``, in a process of its own) answering every
call after ``--latency`` seconds: one ``prompt`` job of ``--items`` items at
LEASH_ITEM_CONCURRENCY ``--concurrency``, default lease, a price set for the model
(LEASH_MODEL_PRICES), so costs are counted too.

A tree that has budgets (``jobs/usage/budget.py``) also runs the same job "with budgets": a job
budget (payload ``"budget": {"tokens": 10**9}``) and an owner's daily budget
(LEASH_OWNER_DAILY_TOKENS=10**12), both far above what the job uses, so every call is checked
against both and none is refused.

Per run, from just before the job is submitted until a second after it ended (the submit, the
claim and the end included, the benchmark's own polling left out), divided by the items:

  commands sent    MONITOR, the commands the submitting process and the worker sent (EVALSHA
                   or EVAL is one command; the commands a script runs are not in it). Counted
                   in the first round only (MONITOR costs the server time), which is not timed.
  read events      INFO stats total_reads_processed: how many times Redis read a request off a
                   client's socket, i.e. round trips (a pipeline is one)
  commands         INFO commandstats: every command Redis ran, including those inside scripts
  items/s          items / (the job's ended_at - started_at), from the job hash
  CPU              per item: the worker's and its work-horse's, the model server's, Redis's, and
                   the time Redis spent running scripts (INFO commandstats usec of EVALSHA)

The first round counts (MONITOR), the next ``--rounds`` are timed, each running every variant
once, in turn, the order reversed every other round (the machine's speed drifts); items/s is
also given as a ratio to the baseline's run of the same round. Prints the tables and one JSON
line. Every process it starts is killed by pid.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psutil
import redis
from benchlib import Children, OwnRedis, wait_until

MODEL = "fake-model"  # tests/fake_openai.py's
PRICES = json.dumps({MODEL: {"input": 0.15, "output": 0.6}})
JOB_BUDGET = {"tokens": 10**9}
OWNER_DAILY_TOKENS = str(10**12)
OWNER = "bench"

# Runs in the tree's own Python: the job is written by that version's code.
ENQUEUE = """
import json, sys
import redis
from jobs.enqueue import enqueue
n, extra = int(sys.argv[2]), json.loads(sys.argv[3])
payload = {"items": [f"item-{i}" for i in range(n)], "template": "{item}", **extra}
job_id, _ = enqueue(redis.Redis.from_url(sys.argv[1]), "prompt", payload, owner=sys.argv[4])
print(job_id)
"""

# The model server, in a process of its own (its threads do not share a GIL with the counting).
SERVER = """
import sys
from tests.fake_openai import FakeOpenAI
server = FakeOpenAI(latency=float(sys.argv[1])).start()
print(server.url, flush=True)
sys.stdin.read()  # until the benchmark closes stdin (or kills it)
server.stop()
"""


@dataclass
class Variant:
    label: str
    tree: Path
    python: str
    budget: dict | None = None
    env: dict = field(default_factory=dict)


@dataclass
class Run:
    variant: str
    round: int
    items_per_s: float
    wall_s: float
    reads: int
    commands: Counter
    sent: Counter | None = None  # MONITOR, counting round only
    in_lua: Counter | None = None
    worker_cpu_s: float = 0.0
    redis_cpu_s: float = 0.0
    scripts_s: float = 0.0
    server_cpu_s: float = 0.0
    usage_calls: int | None = None
    reserved_left: int | None = None


class CountingConnection(redis.Connection):
    """The benchmark's own connection: what it sends is left out of Redis's figures."""

    sent: Counter = Counter()
    round_trips = 0

    def send_command(self, *args, **kwargs):
        CountingConnection.sent[str(args[0]).lower()] += 1
        CountingConnection.round_trips += 1
        return super().send_command(*args, **kwargs)


class Monitor:
    """MONITOR from a start marker to an end marker, leaving out one client's commands."""

    def __init__(self, url: str, skip_address: str):
        self.url = url
        self.skip = skip_address
        self.start_marker = f"bench-usage-start-{time.monotonic_ns()}"
        self.end_marker = f"bench-usage-end-{time.monotonic_ns()}"
        self.sent: Counter = Counter()
        self.in_lua: Counter = Counter()
        self.ended = threading.Event()
        self._client = redis.Redis.from_url(url)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def _listen(self) -> None:
        counting = False
        with self._client.monitor() as monitor:
            self._ready.set()
            for entry in monitor.listen():
                command = entry["command"]
                if self.start_marker in command:
                    counting = True
                    continue
                if self.end_marker in command:
                    self.ended.set()
                    return
                if not counting:
                    continue
                name = command.split(" ", 1)[0].strip('"').lower()
                if entry.get("client_type") == "lua":
                    self.in_lua[name] += 1
                elif f"{entry.get('client_address')}:{entry.get('client_port')}" != self.skip:
                    self.sent[name] += 1

    def start(self, driver: redis.Redis) -> None:
        self._thread.start()
        self._ready.wait(5)
        time.sleep(0.3)  # MONITOR is registered once the listener has read its OK
        driver.echo(self.start_marker)

    def stop(self, driver: redis.Redis) -> None:
        driver.echo(self.end_marker)
        if not self.ended.wait(30):
            raise SystemExit("MONITOR did not see its end marker within 30 s")
        self._thread.join(5)
        self._client.close()


def snapshot(driver: redis.Redis) -> tuple[Counter, int, float, int]:
    """Commands run (by name), read events, Redis's CPU seconds, and the microseconds its
    scripts ran (EVALSHA/EVAL, the commands they ran included)."""
    info = driver.info("all")
    stats = {k.removeprefix("cmdstat_"): v for k, v in info.items() if k.startswith("cmdstat_")}
    commands = Counter({k: v["calls"] for k, v in stats.items()})
    scripts_usec = sum(int(stats.get(name, {}).get("usec", 0)) for name in ("evalsha", "eval"))
    return (commands, int(info["total_reads_processed"]), float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
            scripts_usec)


def cpu_seconds(pid: int) -> float:
    """A worker's CPU time so far, its reaped work-horses included (read after the horse exits)."""
    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system + t.children_user + t.children_system
    except psutil.Error:
        return 0.0


class Bench:
    def __init__(self, args):
        self.args = args
        self.redis = OwnRedis().start()
        pool = redis.ConnectionPool.from_url(self.redis.url, connection_class=CountingConnection)
        self.driver = redis.Redis(connection_pool=pool)
        self.children = Children()
        self.server_url = self._start_server()
        client = self.driver.client_info()
        self.address = client["addr"]

    def _start_server(self) -> str:
        proc = self.children.start([sys.executable, "-c", SERVER, str(self.args.latency)], dict(os.environ),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.server_pid = proc.pid
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline().strip() if ready else ""
        if not line.startswith("http"):
            raise SystemExit("the model server did not start within 30 s")
        return line

    def worker_env(self, variant: Variant) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LEASH_", "REDIS_", "PYTHONPATH"))}
        env.update(REDIS_URL=self.redis.url, LEASH_MODEL_URL=self.server_url, LEASH_MODEL_NAME=MODEL,
                   LEASH_MODEL_API_KEY="bench", LEASH_MODEL_TIMEOUT="30", LEASH_RETRY_BACKOFF="0",
                   LEASH_MODEL_PRICES=PRICES, LEASH_ITEM_CONCURRENCY=str(self.args.concurrency))
        env.update(variant.env)
        return env

    def run(self, variant: Variant, round_no: int, monitor: bool) -> Run:
        n, args = self.args.items, self.args
        self.driver.flushall()
        self.driver.script_flush()  # every run loads its scripts, as on a fresh Redis
        env = self.worker_env(variant)
        children = Children()
        try:
            worker = children.start([variant.python, "-m", "cli", "worker", "--no-scheduler", "--log-level", "WARNING"],
                                    env, root=variant.tree)
            if not wait_until(lambda: self.driver.scard("rq:workers"), 60, interval=0.1):
                raise SystemExit(f"{variant.label}: the worker did not register within 60 s")
            time.sleep(0.5)  # idle, waiting on the queue
            watcher = Monitor(self.redis.url, self.address) if monitor else None
            if watcher:
                watcher.start(self.driver)
            cpu_before, server_before = cpu_seconds(worker.pid), cpu_seconds(self.server_pid)
            commands_before, reads_before, redis_cpu_before, scripts_before = snapshot(self.driver)
            CountingConnection.sent.clear()
            CountingConnection.round_trips = 0
            submit = subprocess.run(
                [variant.python, "-c", ENQUEUE, self.redis.url, str(n), json.dumps({"budget": variant.budget}
                                                                                     if variant.budget else {}), OWNER],
                env=dict(env, PYTHONPATH=str(variant.tree)), cwd=variant.tree, capture_output=True, text=True,
                timeout=60)
            if submit.returncode != 0:
                raise SystemExit(f"{variant.label}: submit failed: {submit.stderr[-2000:]}")
            job_key = f"leash:job:{submit.stdout.strip().splitlines()[-1]}"

            def ended():
                state = self.driver.hget(job_key, "state")
                return state if state in (b"succeeded", b"failed") else None

            state = wait_until(ended, n * args.latency * 4 + 60, interval=0.05)
            if state != b"succeeded":
                fields = self.driver.hgetall(job_key)
                raise SystemExit(f"{variant.label}: the job ended {state}: {fields.get(b'error', b'')[:500]!r}")
            time.sleep(1.0)  # the work-horse exits, the worker records the end
            commands_after, reads_after, redis_cpu_after, scripts_after = snapshot(self.driver)
            cpu_after, server_after = cpu_seconds(worker.pid), cpu_seconds(self.server_pid)
            own, own_round_trips = Counter(CountingConnection.sent), CountingConnection.round_trips
            if watcher:
                watcher.stop(self.driver)
        finally:
            children.cleanup()
        commands = commands_after - commands_before
        commands.subtract(own)
        commands = +commands
        fields = {k.decode(): v.decode() for k, v in self.driver.hgetall(job_key).items()}
        stored = self.driver.hlen(job_key.replace("leash:job:", "leash:items:", 1))
        if stored != n:
            raise SystemExit(f"{variant.label}: {stored} of {n} items stored")
        wall = float(fields["ended_at"]) - float(fields["started_at"])
        return Run(variant.label, round_no, n / wall, wall, reads_after - reads_before - own_round_trips, commands,
                   watcher.sent if watcher else None, watcher.in_lua if watcher else None,
                   worker_cpu_s=cpu_after - cpu_before, redis_cpu_s=redis_cpu_after - redis_cpu_before,
                   scripts_s=(scripts_after - scripts_before) / 1e6, server_cpu_s=server_after - server_before,
                   usage_calls=int(fields["usage_calls"]) if "usage_calls" in fields else None,
                   reserved_left=_reserved_left(fields))

    def close(self) -> None:
        self.children.cleanup()
        self.redis.close()


def variants(trees: list[tuple[str, Path]]) -> list[Variant]:
    out = []
    for label, tree in trees:
        venv = tree / ".venv" / "bin" / "python"
        python = str(venv) if venv.exists() else sys.executable
        out.append(Variant(label, tree, python))
        if (tree / "jobs" / "usage" / "budget.py").exists():
            out.append(Variant(f"{label}, with budgets", tree, python, budget=JOB_BUDGET,
                               env={"LEASH_OWNER_DAILY_TOKENS": OWNER_DAILY_TOKENS}))
    return out


def per_item(counter: Counter, n: int) -> float:
    return sum(counter.values()) / n


def spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def report(runs: list[Run], order: list[str], n: int, baseline: str) -> dict:
    summary = {}
    base_by_round = {r.round: r.items_per_s for r in runs if r.variant == baseline and r.sent is None}
    for label in order:
        counted = next(r for r in runs if r.variant == label and r.sent is not None)
        timed = [r for r in runs if r.variant == label and r.sent is None]
        rates = [r.items_per_s for r in timed]
        summary[label] = {
            "commands_sent_per_item": round(per_item(counted.sent, n), 3),
            "evalsha_per_item": round(counted.sent["evalsha"] / n, 3),
            "commands_in_scripts_per_item": round(per_item(counted.in_lua, n), 3),
            "read_events_per_item": [round(r.reads / n, 3) for r in timed],
            "commands_per_item": [round(per_item(r.commands, n), 3) for r in timed],
            "items_per_s": [round(x, 2) for x in rates],
            "items_per_s_median": round(statistics.median(rates), 2),
            "paired_ratio": [round(r.items_per_s / base_by_round[r.round], 3) for r in timed],
            "worker_cpu_ms_per_item": [round(r.worker_cpu_s / n * 1000, 3) for r in timed],
            "server_cpu_ms_per_item": [round(r.server_cpu_s / n * 1000, 3) for r in timed],
            "redis_cpu_us_per_item": [round(r.redis_cpu_s / n * 1e6, 1) for r in timed],
            "redis_scripts_us_per_item": [round(r.scripts_s / n * 1e6, 1) for r in timed],
            "sent": {k: round(v / n, 3) for k, v in sorted(counted.sent.items())},
            "in_scripts": {k: round(v / n, 3) for k, v in sorted(counted.in_lua.items())},
            "usage_calls": sorted({r.usage_calls for r in timed}, key=str),
            "reserved_tokens_left": sorted({r.reserved_left for r in timed}, key=str),
        }
    base = summary[baseline]["items_per_s_median"]
    print(f"\n## {n} items, one job, one worker; per item; median [min-max] of the timed rounds")
    print(f"| variant | commands sent (round trips) | of them EVALSHA | read events | commands, scripts' included "
          f"| items/s | median / {baseline}'s | same round / {baseline} |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, x in summary.items():
        print(f"| {label} | {x['commands_sent_per_item']:.2f} | {x['evalsha_per_item']:.2f} "
              f"| {spread(x['read_events_per_item'])} | {spread(x['commands_per_item'])} | {spread(x['items_per_s'])} "
              f"| {x['items_per_s_median'] / base:.3f} | {spread(x['paired_ratio'], 3)} |")
    print("\n## CPU per item; median [min-max] of the timed rounds")
    print("| variant | worker + work-horse | model server | Redis (all) | Redis, running scripts (EVALSHA usec) |")
    print("|---|---:|---:|---:|---:|")
    for label, x in summary.items():
        print(f"| {label} | {spread(x['worker_cpu_ms_per_item'])} ms | {spread(x['server_cpu_ms_per_item'])} ms "
              f"| {spread(x['redis_cpu_us_per_item'], 0)} us | {spread(x['redis_scripts_us_per_item'], 0)} us |")
    print("\n## what was sent, and what scripts ran, per item (counting round)")
    for label, x in summary.items():
        print(f"- {label}: sent {x['sent']}; in scripts {x['in_scripts']}; job's usage_calls {x['usage_calls']}, "
              f"reserved tokens left {x['reserved_tokens_left']}")
    print("\nitems/s per round, in round order:")
    for label, x in summary.items():
        print(f"- {label}: {x['items_per_s']}")
    return summary



def _reserved_left(fields: dict) -> int | None:
    """Tokens still reserved once the job ended: per-call reservations' running sum
    (``in_flight_tokens``), or the one pool per job of trees before them (``reserved_tokens``)."""
    for name in ("in_flight_tokens", "reserved_tokens"):
        if name in fields:
            return int(fields[name])
    return None

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="LABEL=PATH",
                        help="a checkout of leash to measure (give two: the first is the baseline)")
    parser.add_argument("--items", type=int, default=480)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trees = []
    for spec in args.tree:
        label, sep, path = spec.partition("=")
        tree = Path(path).resolve()
        if not sep or not (tree / "jobs" / "lua").is_dir():
            parser.error(f"--tree {spec!r}: give LABEL=PATH, PATH a checkout of leash")
        trees.append((label, tree))
    plan = variants(trees)
    print(f"bench_usage {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, load {os.getloadavg()[0]:.2f}; {args.items} items x {args.latency} s, "
          f"concurrency {args.concurrency}, {args.rounds} timed rounds")
    for label, tree in trees:
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        print(f"- {label}: commit {head or '?'}")
    bench = Bench(args)
    runs: list[Run] = []
    try:
        for variant in plan:  # counting round: MONITOR on, not timed
            runs.append(bench.run(variant, 0, monitor=True))
        for round_no in range(1, args.rounds + 1):
            for variant in plan if round_no % 2 else list(reversed(plan)):
                run = bench.run(variant, round_no, monitor=False)
                print(f"  round {round_no}: {variant.label}: {run.items_per_s:.2f} items/s, "
                      f"{per_item(run.commands, args.items):.2f} commands and {run.reads / args.items:.2f} "
                      f"read events per item; CPU per item: worker {run.worker_cpu_s / args.items * 1000:.2f} ms, Redis "
                      f"{run.redis_cpu_s / args.items * 1e6:.0f} us (load {os.getloadavg()[0]:.1f})", flush=True)
                runs.append(run)
    finally:
        bench.close()
    summary = report(runs, [v.label for v in plan], args.items, plan[0].label)
    print(json.dumps({"items": args.items, "latency": args.latency, "concurrency": args.concurrency,
                      "variants": summary}))


if __name__ == "__main__":
    main()
