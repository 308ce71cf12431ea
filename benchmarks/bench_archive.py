"""What the archive saves Redis, and what it costs: Redis bytes per ended item without an
archive and with one (after LEASH_REDIS_KEEP), the time to archive a large job, and the time
to read its page and stream its CSV from Redis and from the archive.

    python benchmarks/bench_archive.py [--items 1000] [--big 10000] [--postgres]

1. On a Redis of its own, against the tests' loopback OpenAI-compatible server
   (``tests/fake_openai.py``, in this process, answering ~1,080 bytes), a ``prompt`` job of
   ``--items`` items of ~400 bytes runs on a ``leash worker --burst`` (request cache on), once
   without an archive and once with one (Redis emptied between). Redis' growth is every key's
   ``MEMORY USAGE`` summed, after the job ended minus before it was submitted; with the archive
   it is measured once the job is archived and its keep time has passed (the request cache's
   answers unused since moved to the archive, as the sweep moves them; every key whose expiry is
   within LEASH_REDIS_KEEP deleted, as the expiry would), split into the request cache and the
   rest.
2. A job of ``--big`` items with 1 KB answers is written into Redis as a worker leaves it
   (succeeded, every item stored with its usage) and archived: the seconds of the one
   transaction (SQLite file; with ``--postgres`` also a throwaway PostgreSQL, tests/pg_support.py).
3. Its page (results and inputs of 50 items from the middle) read from Redis and from the
   archive once Redis' copy has left, median of 20; and the whole CSV streamed both ways (rows
   per second, and the largest Python allocation the archive's stream held, tracemalloc).
Prints the figures and one JSON line. Every process it starts is stopped by pid.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.benchlib import Children, OwnRedis  # noqa: E402
from tests.fake_openai import API_KEY, MODEL, FakeOpenAI  # noqa: E402

PRICES = json.dumps({MODEL: {"input": 0.15, "output": 0.6}})
WORDS = ("the kettle boils fast but the lid is loose and the handle gets hot after a minute of use so I "
         "returned it twice before the shop gave me a refund and a voucher for the next one").split()


def text_of(n: int, size: int, seed: int) -> str:
    """About ``size`` characters of review-like text, different for each ``n``."""
    words, i = [f"#{seed}-{n}"], n
    while sum(len(w) + 1 for w in words) < size:
        i = (i * 1103515245 + 12345) % 2**31
        words.append(WORDS[i % len(WORDS)])
    return " ".join(words)[:size]


def redis_bytes(client) -> int:
    return sum(client.memory_usage(key, samples=0) or 0 for key in client.scan_iter(count=1000))


def cache_bytes(client) -> int:
    from jobs import keys

    entries = client.zrange(keys.CACHE_INDEX, 0, -1)
    return (sum(client.memory_usage(k, samples=0) or 0 for k in entries)
            + sum(client.memory_usage(k, samples=0) or 0 for k in (keys.CACHE_INDEX, keys.CACHE_SIZES, keys.CACHE_BYTES)))


def let_keep_time_pass(client, keep: int) -> int:
    """Delete every key whose expiry falls within ``keep`` seconds, as its expiry would."""
    gone = [key for key in client.scan_iter(count=1000) if 0 <= client.ttl(key) <= keep]
    for start in range(0, len(gone), 500):
        client.delete(*gone[start:start + 500])
    return len(gone)


def run_prompt_job(client, children, items: int, seed: int) -> tuple[str, int]:
    from jobs import keys
    from jobs.enqueue import enqueue

    payload = {"items": [text_of(n, 400, seed) for n in range(items)], "template": "Summarise: {item}"}
    before = redis_bytes(client)
    job_id, _ = enqueue(client, "prompt", payload, owner="bench")
    worker = children.start([sys.executable, "-m", "cli", "worker", "--burst", "--log-level", "WARNING"],
                            env=dict(os.environ))
    worker.wait(900)
    state = client.hget(keys.job(job_id), "state")
    assert state == b"succeeded", state
    return job_id, before


def redis_per_item(client, children, server, items: int, archive_url: str) -> dict:
    from jobs.archive import answers, database, sweep

    keep = int(os.environ.get("LEASH_REDIS_KEEP", "3600"))
    out = {}
    for label, url in (("without archive", None), ("with archive", archive_url)):
        client.flushall()
        if url:
            os.environ["LEASH_ARCHIVE_URL"] = url
        else:
            os.environ.pop("LEASH_ARCHIVE_URL", None)
        database.forget()
        _, before = run_prompt_job(client, children, items, seed=len(out))
        if url:
            while sweep.sweep(client):  # what the workers' sweep does within a second of the end
                pass
            # The keep time has passed: the sweep moves the request cache's unused answers to SQL.
            while answers.retire(client, database.engine(), now=time.time() + keep + 1):
                pass
        let_keep_time_pass(client, keep)  # both ways alike: what leaves within the keep time
        grown = redis_bytes(client) - before
        cached = cache_bytes(client)
        out[label] = {"bytes_per_item": round(grown / items, 1), "cache_bytes_per_item": round(cached / items, 1),
                      "other_bytes_per_item": round((grown - cached) / items, 1)}
    return out


def write_big_job(client, n: int) -> str:
    """A succeeded job of ``n`` items with 1 KB answers, as a worker leaves it."""
    from jobs import keys
    from jobs.config import settings
    from jobs.enqueue import enqueue

    job_id, _ = enqueue(client, "prompt", {"items": [text_of(i, 400, 7) for i in range(n)],
                                           "template": "Summarise: {item}"}, owner="bench")
    now = time.time()
    with client.pipeline(transaction=False) as pipe:
        for start in range(0, n, 1000):
            pipe.hset(keys.items(job_id), mapping={str(i): json.dumps(text_of(i, 1024, 9))
                                                   for i in range(start, min(n, start + 1000))})
            pipe.hset(keys.usage(job_id), mapping={f"i{i}": "1,120,260,0" for i in range(start, min(n, start + 1000))})
        pipe.hset(keys.job(job_id), mapping={"state": "succeeded", "done": n, "ended_at": now, "updated_at": now,
                                             "usage_calls": n, "usage_input_tokens": 120 * n,
                                             "usage_output_tokens": 260 * n, "usage_cost_nusd": 0})
        pipe.lrem(keys.rq_queue(settings().queue), 0, job_id)
        pipe.execute()
    return job_id


def timed(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def stream_csv(client, job_id) -> int:
    from jobs.read import results

    out, rows = io.StringIO(), 0
    writer = csv.writer(out)
    for index, item, value, usage in results.iter_results(client, job_id):
        writer.writerow(results.csv_row(index, item, value, usage))
        rows += 1
        if out.tell() > 1 << 20:  # as a response body is sent: nothing kept
            out.seek(0)
            out.truncate()
    return rows


def big_job(client, n: int, url: str) -> dict:
    from jobs import keys
    from jobs.archive import database, writing
    from jobs.read import results

    client.flushall()
    os.environ["LEASH_ARCHIVE_URL"] = url
    database.forget()
    engine = database.engine()
    job_id = write_big_job(client, n)
    redis_page = timed(lambda: (results.read_page(client, job_id, n // 2, 50),
                                results.item_inputs(client, job_id, n // 2, 50)), 20)
    started = time.perf_counter()
    redis_rows = stream_csv(client, job_id)
    redis_csv = time.perf_counter() - started
    started = time.perf_counter()
    assert writing.archive_one(client, engine, job_id)
    archive_seconds = time.perf_counter() - started
    for key in keys.archived_heavy(job_id, client):  # the keep time has passed
        client.delete(key)
    archive_page = timed(lambda: (results.read_page(client, job_id, n // 2, 50),
                                  results.item_inputs(client, job_id, n // 2, 50)), 20)
    started = time.perf_counter()
    archive_rows = stream_csv(client, job_id)
    archive_csv = time.perf_counter() - started
    assert redis_rows == archive_rows == n
    tracemalloc.start()
    stream_csv(client, job_id)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"items": n, "archive_seconds": round(archive_seconds, 2),
            "page_ms_redis": round(redis_page * 1000, 1), "page_ms_archive": round(archive_page * 1000, 1),
            "csv_rows_per_s_redis": round(n / redis_csv), "csv_rows_per_s_archive": round(n / archive_csv),
            "csv_stream_peak_mb_archive": round(peak / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--big", type=int, default=10_000)
    parser.add_argument("--postgres", action="store_true", help="also archive into a throwaway PostgreSQL")
    args = parser.parse_args()

    own = OwnRedis().start()
    server = FakeOpenAI()
    server.answer = lambda item: (f"summary of {item[:40]}: " + text_of(len(item), 1050, 3))[:1050]
    server.start()
    children = Children()
    folder = tempfile.mkdtemp(prefix="leash-bench-archive-")
    postgres = None
    os.environ.update({"REDIS_URL": own.url, "LEASH_MODEL_URL": server.url, "LEASH_MODEL_NAME": MODEL,
                       "LEASH_MODEL_API_KEY": API_KEY, "LEASH_MODEL_PRICES": PRICES, "LEASH_ITEM_CONCURRENCY": "16",
                       "LEASH_MODEL_MAX_TOKENS": "1024", "LEASH_MAX_ITEMS": str(max(args.items, args.big)),
                       "LEASH_MAX_PAYLOAD_BYTES": "50000000"})
    try:
        sqlite_url = f"sqlite:///{folder}/archive.sqlite3"
        memory = redis_per_item(own.client(), children, server, args.items, sqlite_url)
        big = {"sqlite": big_job(own.client(), args.big, f"sqlite:///{folder}/big.sqlite3")}
        if args.postgres:
            from tests.pg_support import Postgres

            postgres = Postgres()
            postgres.start()
            big["postgresql"] = big_job(own.client(), args.big, postgres.create_database())
    finally:
        children.cleanup()
        server.stop()
        own.close()
        if postgres is not None:
            postgres.close()
    answer = len(server.answer("x" * 400).encode())
    for label, figures in memory.items():
        print(f"{args.items}-item prompt job ({answer}-byte answers), {label}, after LEASH_REDIS_KEEP: "
              f"{figures['bytes_per_item']:,} Redis bytes per ended item "
              f"({figures['cache_bytes_per_item']:,} the request cache, {figures['other_bytes_per_item']:,} the rest)")
    for engine, figures in big.items():
        print(f"{engine}: archiving a {figures['items']:,}-item job (1 KB answers) took {figures['archive_seconds']} s; "
              f"its page {figures['page_ms_redis']} ms from Redis, {figures['page_ms_archive']} ms from the archive; "
              f"CSV {figures['csv_rows_per_s_redis']:,} rows/s from Redis, {figures['csv_rows_per_s_archive']:,} "
              f"from the archive (peak {figures['csv_stream_peak_mb_archive']} MB held)")
    print(json.dumps({"answer_bytes": answer, "redis_per_item": memory, "big_job": big}))


if __name__ == "__main__":
    main()
