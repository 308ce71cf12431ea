"""What a finished job costs Redis: leash against plain RQ, side by side, in one run.

    python benchmarks/bench_memory.py [--jobs 20] [--items 2,100] [--hash-value-limit 64]

For each size, ``--jobs`` ``classify`` jobs of that many items (review-like lines of ~70
characters, two labels, the offline ``local`` backend), all of one owner, run to the end on ``leash worker --burst``; the
same items go to plain RQ as one job each whose function returns the labels, on ``rq worker
--burst``. Then every key in Redis is measured with ``MEMORY USAGE`` and grouped by its name
with the job id (and owner) taken out: bytes per finished job by key, the total, and the
ratio to plain RQ. Keys of the worker processes themselves (``rq:worker:*``, the queue list,
counters) are shown apart, as "shared": they do not grow with jobs.

Last, what is left once every TTL has run out is measured (every key with a TTL deleted, as
its expiry would): nothing per job should remain.
Prints a table and one JSON line. Every process it starts is killed by pid at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import defaultdict

from bench_lifecycle import run_burst
from benchlib import Children, OwnRedis, worker_env
from rq import Queue
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.enqueue import enqueue

PLAIN_CLASSIFY = "benchmarks.plain_rq_jobs.classify"
LABELS = ["positive", "negative"]
OWNER = "bench-owner"
#: Keys that belong to the processes, not to jobs.
SHARED = re.compile(r"^(rq:worker|rq:workers|rq:queues|rq:clean_registries|rq:scheduler|rq:queue:|"
                    r"leash:stats|leash:leases|leash:cancels|leash:active|leash:reaper|leash:schema|"
                    r"leash:models|leash:model_|leash:usage:model|leash:usage:owner|leash:failed$|rq:wip)")


#: Words of customer reviews: items are drawn from them, so they compress as text does (~2.5x),
#: not as a repeated line would.
WORDS = ("the a and it was is my i to of for in this not but very with on they have had you that "
         "delivery late order arrived box damaged broken again refund please support great love "
         "thanks product quality price cheap expensive fast slow shipping customer service return "
         "never always would recommend buy bought week days after before working stopped screen "
         "battery charger cable size small large colour colours fits perfect terrible awful okay "
         "good bad nice happy unhappy disappointed excellent waited email reply replied phone app "
         "update crashed login password reset account money back twice first second time store").split()


def sentences(n: int, seed: int) -> list[str]:
    """``n`` review-like lines of about 70 characters."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < 70:
            words.append(rng.choice(WORDS))
        lines.append(" ".join(words).capitalize() + ".")
    return lines


def key_shape(name: str, ids: set[str]) -> str:
    for part in re.split(r"[:]", name):
        if part in ids:
            name = name.replace(part, "<id>")
    return name.replace(OWNER, "<owner>")


def measure(conn, ids: set[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Bytes by key shape: (per job, shared)."""
    per_job: dict[str, int] = defaultdict(int)
    shared: dict[str, int] = defaultdict(int)
    for raw in conn.scan_iter(count=1000):
        name = raw.decode()
        size = conn.memory_usage(name, samples=0) or 0
        shape = key_shape(name, ids)
        (shared if SHARED.match(name) else per_job)[shape] += size
    return dict(per_job), dict(shared)


def leash_round(children, own, conn, n_jobs: int, n_items: int, extra_env: dict | None = None) -> set[str]:
    conn.flushdb()
    ids = {enqueue(conn, "classify", {"items": sentences(n_items, j), "labels": LABELS}, owner=OWNER)[0]
           for j in range(n_jobs)}
    env = worker_env(own.url, LEASH_MODEL_BACKEND="local", **(extra_env or {}))
    run_burst(children, [sys.executable, "-m", "cli", "worker", "--burst", "--log-level", "WARNING"], env, 600)
    ok = sum(1 for i in ids if conn.hget(keys.job(i), "state") == b"succeeded")
    if ok != n_jobs:
        raise RuntimeError(f"leash: only {ok} of {n_jobs} jobs succeeded")
    return ids


def rq_round(children, own, conn, n_jobs: int, n_items: int) -> set[str]:
    conn.flushdb()
    q = Queue("bench-plain", connection=conn, serializer=JSONSerializer)
    # RQ's default result TTL is 500 s; leash keeps results for weeks, so RQ is asked to as well.
    ids = {q.enqueue(PLAIN_CLASSIFY, sentences(n_items, j), LABELS, result_ttl=6 * 7 * 24 * 3600).id
           for j in range(n_jobs)}
    env = worker_env(own.url)
    run_burst(children, [sys.executable, "-m", "rq.cli", "worker", "--burst", "-u", own.url, "-S",
                         "rq.serializers.JSONSerializer", "-q", "bench-plain"], env, 600)
    return ids


def table(name: str, per_job: dict[str, int], n_jobs: int) -> int:
    total = sum(per_job.values()) / n_jobs
    print(f"  {name}: {total:,.0f} B per finished job")
    for shape, size in sorted(per_job.items(), key=lambda kv: -kv[1]):
        print(f"    {size / n_jobs:8,.0f} B  {shape}")
    return round(total)


def leftovers(children, own, conn, n_jobs: int) -> dict[str, int]:
    """What is left per job once every TTL has run out: every key that has a TTL is deleted,
    as its expiry would (waiting out LEASH_RESULT_TTL, 60 s at least, proves nothing more)."""
    ids = leash_round(children, own, conn, n_jobs, 2)
    for raw in list(conn.scan_iter(count=1000)):
        if conn.ttl(raw) > 0:
            conn.delete(raw)
    per_job, _ = measure(conn, ids)
    return {shape: round(size / n_jobs) for shape, size in per_job.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--items", default="2,100")
    parser.add_argument("--hash-value-limit", type=int, default=None,
                        help="set Redis' hash-max-listpack-value (default 64): a hash whose every value fits "
                             "is stored compactly; plain RQ's job hash carries the compressed payload")
    args = parser.parse_args()
    own, children = OwnRedis().start(), Children()
    conn = own.client()
    if args.hash_value_limit:
        conn.config_set("hash-max-ziplist-value", args.hash_value_limit)  # the name Redis 6.2 and 7 both take
    figures: dict = {"redis": conn.info("server")["redis_version"], "jobs": args.jobs, "sizes": {},
                     "hash_value_limit": int(conn.config_get("hash-max-ziplist-value")["hash-max-ziplist-value"])}
    try:
        for n_items in (int(x) for x in args.items.split(",")):
            print(f"{n_items}-item jobs ({args.jobs} of them), MEMORY USAGE per finished job:")
            ids = leash_round(children, own, conn, args.jobs, n_items)
            leash_keys, leash_shared = measure(conn, ids)
            leash_total = table("leash", leash_keys, args.jobs)
            ids = rq_round(children, own, conn, args.jobs, n_items)
            rq_keys, _ = measure(conn, ids)
            rq_total = table("plain RQ", rq_keys, args.jobs)
            print(f"  leash / RQ: {leash_total / rq_total:.2f}")
            figures["sizes"][n_items] = {
                "leash_bytes": leash_total, "rq_bytes": rq_total, "ratio": round(leash_total / rq_total, 2),
                "leash_by_key": {k: round(v / args.jobs) for k, v in leash_keys.items()},
                "rq_by_key": {k: round(v / args.jobs) for k, v in rq_keys.items()},
                "leash_shared_bytes": sum(leash_shared.values()),
            }
        left = leftovers(children, own, conn, args.jobs)
        print(f"left per job after every TTL ran out: {sum(left.values())} B {left or ''}")
        figures["left_after_ttl"] = left
        print(json.dumps(figures))
    finally:
        children.cleanup()
        own.close()


if __name__ == "__main__":
    main()
