"""What the request cache saves and costs, and what a price before the run costs.

    python benchmarks/bench_cache.py [--items 1000] [--dry-run-items 10000]

On a Redis of its own, against the tests' loopback OpenAI-compatible server
(``tests/fake_openai.py``, in this process), a ``prompt`` job of ``--items`` items is run twice
by a ``leash worker --burst`` (a process of its own; LEASH_ITEM_CONCURRENCY 16): the first run
pays for every request, the second is answered from the cache. For each run it prints the
provider calls, the Redis round trips (INFO stats ``total_reads_processed``, every client:
submit, claim, items, end) per item, and Redis commands per item (INFO commandstats, those run
inside scripts included). Then the bytes per cache entry: Redis's own ``MEMORY USAGE`` of the
entries plus their share of the index and the sizes hash, beside the answer's length and what
leash counts against LEASH_CACHE_MAX_MB. Last, the dry run of ``--dry-run-items`` items (its
time, median of 5, and the commands and round trips it sent, counted under MONITOR). Prints the
figures and one JSON line. Every process it starts is killed by pid.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.benchlib import Children, OwnRedis, commandstats, count_commands  # noqa: E402
from tests.fake_openai import API_KEY, MODEL, FakeOpenAI  # noqa: E402

PRICES = json.dumps({MODEL: {"input": 0.15, "output": 0.6}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--dry-run-items", type=int, default=10_000)
    args = parser.parse_args()

    own = OwnRedis().start()
    server = FakeOpenAI()
    server.start()
    children = Children()
    settings = {"REDIS_URL": own.url, "LEASH_MODEL_URL": server.url, "LEASH_MODEL_NAME": MODEL,
                "LEASH_MODEL_API_KEY": API_KEY, "LEASH_MODEL_PRICES": PRICES, "LEASH_ITEM_CONCURRENCY": "16",
                "LEASH_MAX_ITEMS": str(max(args.items, args.dry_run_items)), "LEASH_MAX_PAYLOAD_BYTES": "50000000"}
    os.environ.update(settings)
    try:
        from jobs import keys
        from jobs.enqueue import enqueue
        from jobs.intake.submission import dry_run

        client = own.client()
        items = [f"review {i:05d}: the kettle boils fast but the lid is loose" for i in range(args.items)]
        payload = {"items": items, "template": "Summarise in five words: {item}"}
        runs = []
        for label in ("first run (nothing cached)", "second run (all cached)"):
            calls_before = len(server.billed)
            client.config_resetstat()
            reads_before = client.info("stats")["total_reads_processed"]
            job_id, _ = enqueue(client, "prompt", payload, owner="bench")
            worker = children.start([sys.executable, "-m", "cli", "worker", "--burst", "--log-level", "WARNING"],
                                    env=dict(os.environ))
            worker.wait(600)
            state = client.hget(keys.job(job_id), "state")
            reads = client.info("stats")["total_reads_processed"] - reads_before - 2  # the two INFO reads
            commands = sum(commandstats(client).values())
            hits = int(client.hget(keys.job(job_id), "usage_cache_hits") or 0)
            runs.append({"run": label, "state": state.decode(), "provider_calls": len(server.billed) - calls_before,
                         "cache_hits": hits, "round_trips_per_item": round(reads / args.items, 2),
                         "commands_per_item": round(commands / args.items, 2)})
        entries = client.zrange(keys.CACHE_INDEX, 0, -1)
        entry_bytes = sum(client.memory_usage(k) or 0 for k in entries)
        shared = (client.memory_usage(keys.CACHE_INDEX) or 0) + (client.memory_usage(keys.CACHE_SIZES) or 0)
        answers = [len(json.loads(client.get(k))[0].encode()) for k in entries]
        per_entry = {"entries": len(entries), "answer_bytes_mean": round(statistics.mean(answers), 1),
                     "redis_bytes_per_entry": round((entry_bytes + shared) / len(entries), 1),
                     "leash_counted_bytes_per_entry": round(int(client.get(keys.CACHE_BYTES)) / len(entries), 1)}

        dry_items = [f"review {i:05d}: the kettle boils fast but the lid is loose" for i in range(args.dry_run_items)]
        dry_payload = {"items": dry_items, "template": "Summarise in five words: {item}"}
        times = []
        for _ in range(5):
            started = time.perf_counter()
            figures = dry_run(client, "prompt", dry_payload, owner="bench")
            times.append(time.perf_counter() - started)
        counted = count_commands(own.url, lambda: dry_run(own.client(), "prompt", dry_payload, owner="bench"))
        dry = {"items": args.dry_run_items, "seconds_median": round(statistics.median(times), 3),
               "round_trips": counted.round_trips, "commands_sent": dict(counted.client),
               "cached_items": figures["cached_items"], "cost_usd_max": figures["cost_usd_max"]}
    finally:
        children.cleanup()
        server.stop()
        own.close()
    for run in runs:
        print(f"{run['run']}: {run['state']}, {run['provider_calls']} provider calls, {run['cache_hits']} cache hits, "
              f"{run['round_trips_per_item']} round trips and {run['commands_per_item']} Redis commands per item")
    print(f"cache entries: {per_entry['entries']}, answer {per_entry['answer_bytes_mean']} bytes on average, "
          f"{per_entry['redis_bytes_per_entry']} bytes of Redis memory per entry (MEMORY USAGE), "
          f"{per_entry['leash_counted_bytes_per_entry']} counted against LEASH_CACHE_MAX_MB")
    print(f"dry run of {dry['items']} items: {dry['seconds_median']} s (median of 5), {dry['round_trips']} round "
          f"trips, commands {dry['commands_sent']}, {dry['cached_items']} cached, worst case ${dry['cost_usd_max']}")
    print(json.dumps({"runs": runs, "entry": per_entry, "dry_run": dry}))


if __name__ == "__main__":
    main()
