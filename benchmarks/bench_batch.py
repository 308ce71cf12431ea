"""Batch mode: what a job waiting for its provider costs leash, against a plain RQ job doing the
same the plain way (create the batch, sleep and poll in the work-horse, store the answers).

    python benchmarks/bench_batch.py [--items 10000] [--wait 60] [--poll 2]

One ``prompt`` job of ``--items`` items with ``mode: "batch"`` runs on one ``leash worker``
against the tests' loopback OpenAI-compatible server (``tests/fake_openai.py`` with its Batch API,
through the official SDK), on a Redis of this script's own. The provider is held: the benchmark
completes the batch ``--wait`` seconds after it was created, as a provider would after its
queue. LEASH_BATCH_POLL_SECONDS is ``--poll`` (short, so the run takes a minute, not hours; the
default is 60 s, and the figures for it are derived from the measured cost of one look). Then
the same job as a plain RQ function on a plain ``rq worker``.

Printed:

  commands/item     INFO commandstats delta from the submit to the job's end, per item (every
                    command Redis ran, those inside Lua scripts included); EVALSHA per item
  held during wait  seconds a worker was busy with the job while the provider worked (RQ's
                    total_working_time of the worker over the looks, the create turn left out: it
                    runs before the provider works), and as a share of the wait; per look; and
                    the share the same looks would take at the default poll interval (60 s)
  completion->end   from the moment the batch completed at the provider to the job's end
                    (leash: its ended_at; plain RQ: its ended_at), goal <= poll + 5 s

Every process it starts is killed by pid.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import redis
from benchlib import Children, OwnRedis, wait_until

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rq import Queue, Worker  # noqa: E402
from rq.job import Job  # noqa: E402
from rq.serializers import JSONSerializer  # noqa: E402

from tests.fake_openai import MODEL, FakeOpenAI  # noqa: E402

DEFAULT_POLL = 60.0


def worker_time(client: redis.Redis) -> float:
    return sum(w.total_working_time for w in Worker.all(connection=client))


def run_leash(url: str, server: FakeOpenAI, items: int, wait: float, poll: float, children: Children) -> dict:
    from jobs import keys
    from jobs.enqueue import enqueue

    client = redis.Redis.from_url(url)
    env = _env(url, server, LEASH_BATCH_POLL_SECONDS=str(poll), LEASH_MAX_ITEMS=str(items))
    children.start([sys.executable, "-m", "cli", "worker", "--log-level", "WARNING"], env)
    wait_until(lambda: Worker.all(connection=client), 30)
    client.config_resetstat()
    before = time.time()
    import os

    os.environ.update(env)  # enqueue checks the backend has a batch API
    job_id, _ = enqueue(client, "prompt", {"items": [f"item-{i}" for i in range(items)], "template": "Say {item}",
                                           "mode": "batch"})
    batch_id = wait_until(lambda: next(iter(server.batches.batches), None), 120)
    created = server.batches.batch(batch_id).created_at
    wait_until(lambda: client.hget(keys.job(job_id), "phase") == b"waiting", 120)
    parked_at = time.time()
    creating = wait_until(lambda: worker_time(client), 30)  # the create turn, as RQ recorded it
    time.sleep(max(0.0, created + wait - time.time()))
    held_during_wait = worker_time(client) - creating  # the looks: each ended before the batch did
    looks = (Job.fetch(job_id, connection=client, serializer=JSONSerializer).number_of_retries or 1) - 1  # a Retry per park: create + looks
    completed_at = time.time()
    server.batches.complete(batch_id)
    wait_until(lambda: client.hget(keys.job(job_id), "state") in (b"succeeded", b"failed"), 600)
    state, ended_at = client.hmget(keys.job(job_id), "state", "ended_at")
    stats = client.info("commandstats")
    commands = sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info" and k != "cmdstat_config")
    return {"state": state.decode(), "items": items, "wait_s": round(completed_at - created, 1),
            "create_s": round(parked_at - before, 2), "create_worker_s": round(creating, 3),
            "held_during_wait_s": round(held_during_wait, 3),
            "looks": looks, "commands_per_item": round(commands / items, 2),
            "evalsha_per_item": round(stats.get("cmdstat_evalsha", {}).get("calls", 0) / items, 2),
            "completion_to_end_s": round(float(ended_at) - completed_at, 2)}


def run_plain(url: str, server: FakeOpenAI, items: int, wait: float, poll: float, children: Children) -> dict:
    client = redis.Redis.from_url(url)
    client.flushdb()
    children.start([sys.executable, "-m", "rq.cli", "worker", "--url", url, "--quiet", "plain"],
                   _env(url, server))
    wait_until(lambda: Worker.all(connection=client), 30)
    client.config_resetstat()
    queue = Queue("plain", connection=client)
    known = set(server.batches.batches)
    job = queue.enqueue("benchmarks.plain_rq_jobs.batch_and_wait", server.url, MODEL, items, poll, "plain:results",
                        job_timeout=3600)
    batch_id = wait_until(lambda: next((b for b in server.batches.batches if b not in known), None), 120)
    created = server.batches.batch(batch_id).created_at
    time.sleep(max(0.0, created + wait - time.time()))
    completed_at = time.time()
    server.batches.complete(batch_id)
    wait_until(lambda: Job.fetch(job.id, connection=client).get_status() in ("finished", "failed"), 600)
    fetched = Job.fetch(job.id, connection=client)
    stats = client.info("commandstats")
    commands = sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info" and k != "cmdstat_config")
    return {"state": str(fetched.get_status()), "items": client.hlen("plain:results"),
            "held_during_wait_s": round(completed_at - fetched.started_at.timestamp(), 1),
            "commands_per_item": round(commands / items, 2),
            "completion_to_end_s": round(fetched.ended_at.timestamp() - completed_at, 2)}


def _env(url: str, server: FakeOpenAI, **extra: str) -> dict:
    import os

    return dict(os.environ, REDIS_URL=url, LEASH_MODEL_URL=server.url, LEASH_MODEL_NAME=MODEL,
                LEASH_MODEL_API_KEY="bench", LEASH_MODEL_MAX_TOKENS="64", **extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--wait", type=float, default=60.0, help="seconds the provider works on the batch")
    parser.add_argument("--poll", type=float, default=2.0, help="LEASH_BATCH_POLL_SECONDS for the run")
    args = parser.parse_args()
    own = OwnRedis().start()
    server = FakeOpenAI().start()
    server.batches.auto = False  # completed by the benchmark after --wait
    children = Children()
    try:
        leash = run_leash(own.url, server, args.items, args.wait, args.poll, children)
        children.cleanup()
        children = Children()
        plain = run_plain(own.url, server, args.items, args.wait, args.poll, children)
    finally:
        children.cleanup()
        server.stop()
        own.close()
    per_look = leash["held_during_wait_s"] / max(1, leash["looks"])
    share = leash["held_during_wait_s"] / leash["wait_s"]
    at_default = per_look * (leash["wait_s"] / DEFAULT_POLL) / leash["wait_s"]
    print(f"batch job of {args.items} items, provider busy {leash['wait_s']} s, LEASH_BATCH_POLL_SECONDS={args.poll}")
    print(f"{'':28} {'leash':>12} {'plain RQ':>12}")
    print(f"{'state':28} {leash['state']:>12} {plain['state']:>12}")
    print(f"{'Redis commands per item':28} {leash['commands_per_item']:>12} {plain['commands_per_item']:>12}")
    print(f"{'worker-s held during wait':28} {leash['held_during_wait_s']:>12} {plain['held_during_wait_s']:>12}")
    print(f"{'  share of the wait':28} {share:>11.2%} {plain['held_during_wait_s'] / leash['wait_s']:>11.0%}")
    print(f"{'completion -> job end (s)':28} {leash['completion_to_end_s']:>12} {plain['completion_to_end_s']:>12}")
    print(f"leash: {leash['looks']} looks, {per_look * 1000:.0f} ms of worker time each; at the default "
          f"poll of {DEFAULT_POLL:g} s the looks hold a worker {at_default:.3%} of the wait; "
          f"EVALSHA per item {leash['evalsha_per_item']}; create and park {leash['create_s']} s")
    print(json.dumps({"leash": leash, "plain_rq": plain, "held_share": round(share, 5),
                      "held_share_at_default_poll": round(at_default, 6)}))


if __name__ == "__main__":
    main()
