"""How close to its budget a job gets before it stops, and what checking budgets costs Redis,
for checkouts of leash side by side (before and after a change).

    python benchmarks/bench_budget.py --tree before=../leash-before --tree after=. [--items 200]
        [--latency 0.01] [--batch]

Each ``--tree LABEL=PATH`` is a checkout of leash; its jobs are submitted by its own
``enqueue`` and run by its own ``leash worker`` (this script's Python, PYTHONPATH=PATH; PATH/.venv
when it has one), on a Redis of this script's own (flushed before every run), against the
tests' stand-in provider (``tests/fake_openai.py`` of THIS checkout, in this process: every tree
is billed by the same rules -- ~4 ASCII characters a token, 2 tokens for any other character,
never past max_tokens) answering after ``--latency`` seconds.

1. Budget use. A ``prompt`` job of ``--items`` reviews (English, or Japanese), max_tokens 64,
   with a budget in tokens of ten times one call's worst case (its prompt's UTF-8 bytes, the
   chat template's 12 tokens, 64) plus 100 -- the job needs several times that -- at
   LEASH_ITEM_CONCURRENCY 1, 16 and 64; with ``--batch`` also in batch mode (the provider ends
   each batch at its first look). Printed: how the job ended, what the provider billed as a
   share of the budget, the items stored and the calls billed.
2. Redis per item. A ``prompt`` job of ``--items`` items at concurrency 16 without a budget,
   and with a job budget (10**9 tokens) and an owner's daily budget (10**12) far above its
   need, so every call is checked against both. Printed per item, from just before the submit
   to a second after the job ended: the commands Redis ran (INFO commandstats, the commands
   inside scripts included; the benchmark's own left out) and the read events
   (total_reads_processed: round trips).

Every process it starts is killed by pid. Prints the tables and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import redis
from bench_usage import CountingConnection, snapshot
from benchlib import ROOT, Children, OwnRedis, wait_until

from tests.fake_openai import FakeOpenAI

MODEL = "fake-model"
PRICES = json.dumps({MODEL: {"input": 0.15, "output": 0.6}})
TEMPLATE = "Summarise: {item}"
MAX_TOKENS = 64
LANGUAGES = {
    "English": lambda i: f"review {i:03d}: the blender works well but is loud",
    "Japanese": lambda i: f"レビュー{i:03d}：このミキサーはよく動くが、音が大きい。",
}
OWNER = "bench"

ENQUEUE = """
import json, sys
import redis
from jobs.enqueue import enqueue
payload = json.loads(sys.argv[2])
job_id, _ = enqueue(redis.Redis.from_url(sys.argv[1]), "prompt", payload, owner=sys.argv[3])
print(job_id)
"""


def worst_case(items: list[str]) -> int:
    return max(len(TEMPLATE.format(item=i).encode()) for i in items) + 12 + MAX_TOKENS


class Bench:
    def __init__(self, args):
        self.args = args
        self.redis = OwnRedis().start()
        pool = redis.ConnectionPool.from_url(self.redis.url, connection_class=CountingConnection)
        self.driver = redis.Redis(connection_pool=pool)

    def run(self, tree: Path, payload: dict, env_extra: dict, batch: bool = False) -> dict:
        """One job on a fresh Redis and a fresh stand-in: how it ended, what it cost."""
        self.driver.flushall()
        self.driver.script_flush()
        server = FakeOpenAI(latency=self.args.latency).start()
        if batch:
            server.batches.auto = True
            server.batches.seconds_per_step = 0.001
        venv = tree / ".venv" / "bin" / "python"
        python = str(venv) if venv.exists() else sys.executable
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LEASH_", "REDIS_", "PYTHONPATH"))}
        env.update(REDIS_URL=self.redis.url, LEASH_MODEL_URL=server.url, LEASH_MODEL_NAME=MODEL,
                   LEASH_MODEL_API_KEY="bench", LEASH_MODEL_TIMEOUT="30", LEASH_RETRY_BACKOFF="0",
                   LEASH_MODEL_PRICES=PRICES, LEASH_MODEL_MAX_TOKENS=str(MAX_TOKENS),
                   LEASH_BATCH_POLL_SECONDS="0.2", LEASH_BATCH_POLL_MAX="0.2", **env_extra)
        children = Children()
        try:
            argv = [python, "-m", "cli", "worker", "--log-level", "ERROR"] + ([] if batch else ["--no-scheduler"])
            children.start(argv, env, root=tree)
            if not wait_until(lambda: self.driver.scard("rq:workers"), 60, interval=0.1):
                raise SystemExit(f"{tree}: the worker did not register within 60 s")
            time.sleep(0.5)
            commands_before, reads_before, _, _ = snapshot(self.driver)
            CountingConnection.sent.clear()
            CountingConnection.round_trips = 0
            submit = subprocess.run([python, "-c", ENQUEUE, self.redis.url, json.dumps(payload), OWNER],
                                    env=dict(env, PYTHONPATH=str(tree)), cwd=tree, capture_output=True, text=True,
                                    timeout=60)
            if submit.returncode != 0:
                raise SystemExit(f"{tree}: submit failed: {submit.stderr[-2000:]}")
            job_key = f"leash:job:{submit.stdout.strip().splitlines()[-1]}"

            def ended():
                state = self.driver.hget(job_key, "state")
                return state if state in (b"succeeded", b"failed") else None

            state = wait_until(ended, 300, interval=0.05)
            if state is None:
                raise SystemExit(f"{tree}: the job did not end within 300 s")
            time.sleep(1.0)  # the work-horse exits, the worker records the end
            commands_after, reads_after, _, _ = snapshot(self.driver)
            own, own_round_trips = Counter(CountingConnection.sent), CountingConnection.round_trips
        finally:
            children.cleanup()
            server.stop()
        commands = commands_after - commands_before
        commands.subtract(own)
        fields = {k.decode(): v.decode() for k, v in self.driver.hgetall(job_key).items()}
        billed = server.batches.batch_billed if batch else server.billed
        return {"state": state.decode(), "error": fields.get("error", "")[:60],
                "stored": self.driver.hlen(job_key.replace("leash:job:", "leash:items:", 1)),
                "calls": len(billed), "billed": sum(p + c for p, c in billed),
                "counted": int(fields.get("usage_input_tokens") or 0) + int(fields.get("usage_output_tokens") or 0),
                "commands": sum(v for v in commands.values() if v > 0), "reads": reads_after - reads_before
                - own_round_trips}

    def close(self) -> None:
        self.redis.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="LABEL=PATH")
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.01)
    parser.add_argument("--batch", action="store_true", help="also the budget use of a batch-mode job")
    args = parser.parse_args()
    trees = [(label, Path(path).resolve()) for label, _, path in (t.partition("=") for t in args.tree)]
    bench = Bench(args)
    use, cost = [], []
    try:
        for label, tree in trees:
            for language, item in LANGUAGES.items():
                items = [item(i) for i in range(args.items)]
                budget_tokens = 10 * worst_case(items) + 100
                modes = [(str(c), {"LEASH_ITEM_CONCURRENCY": str(c)}, False) for c in (1, 16, 64)]
                if args.batch:
                    modes.append(("batch", {}, True))
                for mode, env, batch in modes:
                    payload = {"items": items, "template": TEMPLATE, "budget": {"tokens": budget_tokens}}
                    if batch:
                        payload["mode"] = "batch"
                    r = bench.run(tree, payload, env, batch=batch)
                    use.append({"tree": label, "language": language, "at_once": mode, "budget": budget_tokens, **r})
                    print(f"  {label} {language} {mode}: {r['state']} billed {r['billed']:,} "
                          f"({r['billed'] / budget_tokens:.1%})", file=sys.stderr, flush=True)
            items = [f"item-{i}" for i in range(args.items)]
            for variant, budget, env in (("no budget", None, {}),
                                         ("job + owner budgets", {"tokens": 10**9},
                                          {"LEASH_OWNER_DAILY_TOKENS": str(10**12)})):
                payload = {"items": items, "template": "{item}", **({"budget": budget} if budget else {})}
                r = bench.run(tree, payload, dict(env, LEASH_ITEM_CONCURRENCY="16"))
                if r["state"] != "succeeded":
                    raise SystemExit(f"{label} {variant}: the job ended {r['state']}: {r['error']}")
                cost.append({"tree": label, "variant": variant, **r})
    finally:
        bench.close()
    print(f"\nBudget use: {args.items} items, max_tokens {MAX_TOKENS}, budget = 10 x one call's worst case + 100")
    print("| tree | text | calls at once | budget | ended | billed by the provider | share of the budget "
          "| items stored | counted = billed |")
    print("|---|---|---|---:|---|---:|---:|---:|---|")
    for r in use:
        ended = r["state"] if r["state"] == "succeeded" else f"{r['state']}: {r['error'][:30]}..."
        print(f"| {r['tree']} | {r['language']} | {r['at_once']} | {r['budget']:,} | {ended} | {r['billed']:,} "
              f"| {r['billed'] / r['budget']:.1%} | {r['stored']} | {'yes' if r['counted'] == r['billed'] else 'no'} |")
    print(f"\nRedis per item: a {args.items}-item prompt job, 16 calls at once")
    print("| tree | budgets | commands / item | read events / item |")
    print("|---|---|---:|---:|")
    for r in cost:
        print(f"| {r['tree']} | {r['variant']} | {r['commands'] / args.items:.1f} | {r['reads'] / args.items:.1f} |")
    print(json.dumps({"items": args.items, "latency": args.latency, "use": use, "cost": cost}))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
