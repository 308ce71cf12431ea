"""Redis behind Sentinel, with real processes on loopback: a primary, a replica, a Sentinel
(tests/sentinel_support.py), ``leash worker`` processes on ``REDIS_URL=redis+sentinel://...``
and the fake model server.

The chaos test cuts replication, lets the primary acknowledge writes the replica never gets
(the window asynchronous replication leaves open), then SIGKILLs the primary; the Sentinel
promotes the replica. Every job must still end ``succeeded`` with all its items, nothing
left running, queued or in RQ's started registry, and no worker may die. What the lost
writes cost is measured: items stored on the old primary after the cut are computed again
(and billed again) on the new one.
"""

from __future__ import annotations

import json
import time

import pytest
import redis
from click.testing import CliRunner
from rq.registry import StartedJobRegistry

from cli import main
from jobs import keys
from jobs.core.store.connection import connect
from jobs.enqueue import enqueue
from tests.conftest import wait_for
from tests.fake_openai import FakeOpenAI, serving
from tests.sentinel_support import SentinelSet

pytestmark = pytest.mark.slow

LABELS = ["positive", "negative"]
JOBS, ITEMS = 20, 6


@pytest.fixture
def sentinels():
    trio = SentinelSet(down_after_ms=1000, failover_timeout_ms=5000).start()
    yield trio
    trio.close()


@pytest.fixture
def slow_model(env):
    yield from serving(env, FakeOpenAI(latency=0.25))


def _quiet(read):
    """``read`` polled across the failover: None while no primary answers."""
    def polled(*args):
        try:
            return read(*args)
        except redis.exceptions.ConnectionError:
            return None
    return polled


def _items_stored(client, job_ids) -> int:
    with client.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hlen(keys.items(job_id))
        return sum(pipe.execute())


def _states(client, job_ids) -> dict[str, int]:
    with client.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hget(keys.job(job_id), "state")
        rows = pipe.execute()
    counts: dict[str, int] = {}
    for state in rows:
        counts[(state or b"missing").decode()] = counts.get((state or b"missing").decode(), 0) + 1
    return counts


def _nothing_stuck(client) -> bool:
    return (client.zcard(keys.LEASES) == 0 and client.llen(keys.rq_queue("leash")) == 0
            and StartedJobRegistry("leash", connection=client).count == 0)


@pytest.mark.timeout(300)
def test_the_primary_killed_mid_flight_with_writes_lost_every_job_still_succeeds(env, workers, sentinels, slow_model,
                                                                                 tmp_path):
    env.setenv("REDIS_URL", sentinels.url())
    # Longer than the failover (about 3 s here), as the lease must be in production (OPERATIONS.md).
    env.setenv("LEASH_LEASE_SECONDS", "6")
    env.setenv("LEASH_ITEM_CONCURRENCY", "2")
    client = connect(sentinels.url())
    job_ids = [enqueue(client, "classify", {"items": [f"job {j} item {i} -> positive" for i in range(ITEMS)],
                                            "labels": LABELS}, owner=f"owner-{j}")[0] for j in range(JOBS)]
    logs = [(tmp_path / f"worker-{i}.log").open("wb") for i in range(3)]
    procs = [workers.start("--name", f"sentinel-w{i}", stderr=logs[i]) for i in range(3)]
    wait_for(lambda: _states(client, job_ids).get("succeeded", 0) >= 3, 60, message="three jobs done")

    assert client.execute_command("WAIT", 1, 2000) == 1  # everything so far is on the replica
    stored_at_cut = _items_stored(client, job_ids)
    sentinels.cut_replication()
    # The primary goes on acknowledging checkpoints (and claims, and endings) the replica never sees.
    wait_for(lambda: _items_stored(client, job_ids) >= stored_at_cut + 8, 30, message="checkpoints after the cut")
    lost_items = _items_stored(client, job_ids) - stored_at_cut
    running_at_kill = _states(client, job_ids).get("running", 0)
    sentinels.kill_primary()
    killed = time.monotonic()
    promoted_after = sentinels.wait_promoted()

    states = _quiet(_states)
    wait_for(lambda: (states(client, job_ids) or {}).get("succeeded", 0) == JOBS, 150, interval=0.2,
             message="every job succeeded after the failover")
    drained_after = time.monotonic() - killed
    # A write the failover lost can leave a duplicate queue entry or a started entry that only a
    # worker's next pass or its consistency sweep clears: up to a minute on a busy machine.
    wait_for(lambda: _quiet(_nothing_stuck)(client), 60, message="no lease, queue entry or started entry left")

    for job_id in job_ids:
        job = {k.decode(): v.decode() for k, v in client.hgetall(keys.job(job_id)).items()}
        assert job["state"] == "succeeded" and int(job["done"]) == int(job["total"]) == ITEMS, job
        assert sorted(int(i) for i in client.hkeys(keys.items(job_id))) == list(range(ITEMS))
        assert int(job["attempts"]) <= int(job["max_attempts"])
        assert json.loads(client.hget(keys.items(job_id), 0)) == "positive"
    assert all(proc.poll() is None for proc in procs), "a worker died in the failover"
    for i, log in enumerate(logs):  # ridden out: an alert on ERROR must not fire
        log.close()
        text = (tmp_path / f"worker-{i}.log").read_text()
        assert [line for line in text.splitlines() if " ERROR " in line or "Traceback" in line] == [], text[-4000:]
    billed = len(slow_model.billed)
    figures = {"jobs": JOBS, "items": JOBS * ITEMS, "calls_billed": billed, "calls_redone": billed - JOBS * ITEMS,
               "items_acknowledged_then_lost": lost_items, "running_at_kill": running_at_kill,
               "promoted_after_s": round(promoted_after, 1), "all_succeeded_after_s": round(drained_after, 1),
               "reclaims": int(client.get(keys.RECLAIMS) or 0),
               "zombie_writes_rejected": int(client.get(keys.REJECTED_WRITES) or 0)}
    print("sentinel failover:", json.dumps(figures))
    # Only what the failover lost is computed twice: the lost items, plus items in flight whose
    # attempt was taken back (a lost claim or ending) — never the whole batch again.
    assert billed >= JOBS * ITEMS
    assert billed - JOBS * ITEMS <= lost_items + 3 * 2 * running_at_kill + 6


def test_the_cli_the_web_app_and_rq_dashboard_work_through_sentinel_and_after_a_failover(env, workers, sentinels):
    from web.app import create_app

    env.setenv("REDIS_URL", sentinels.url())
    env.setenv("LEASH_LOCAL_DELAY_MS", "0")
    env.setenv("LEASH_DEV", "1")  # rq-dashboard mounted without a password
    workers.start("--name", "sentinel-cli")
    runner = CliRunner()
    web = create_app({"LEASH_DEV": True}).test_client()

    def state_of(job_id: str) -> str | None:
        result = runner.invoke(main, ["status", job_id, "--json"])
        return json.loads(result.stdout)["state"] if result.exit_code == 0 else None

    def answers(path: str) -> bool:
        return web.get(path, headers={"Accept": "application/json"}).status_code == 200

    first = _submit_or_none(runner, "before")
    assert first is not None
    wait_for(lambda: state_of(first) == "succeeded", 30, interval=0.2, message="a job through Sentinel")
    assert answers(f"/jobs/{first}") and answers(f"/rq/0/data/job/{first}.json")

    sentinels.kill_primary()
    sentinels.wait_promoted()
    # The CLI while no primary answers: one line, exit 1, never a traceback.
    second = wait_for(lambda: _submit_or_none(runner, "after"), 30, interval=0.5, message="a submission")
    wait_for(lambda: state_of(second) == "succeeded", 60, interval=0.2, message="a job on the new primary")
    assert state_of(first) == "succeeded"  # replicated before the failover
    wait_for(lambda: answers(f"/jobs/{second}"), 30, interval=0.5, message="the web app on the new primary")
    wait_for(lambda: answers(f"/rq/0/data/job/{second}.json"), 30, interval=0.5, message="rq-dashboard")


def _submit_or_none(runner, text: str) -> str | None:
    result = runner.invoke(main, ["submit", "--labels", "a,b", "-"], input=f"{text} -> a\n")
    if result.exit_code != 0:
        assert result.exit_code == 3 and len(result.output.strip().splitlines()) == 1, result.output
        assert "Traceback" not in result.output
        return None
    return result.stdout.strip().splitlines()[-1]


def test_after_a_planned_switch_a_client_that_follows_the_primary_stops_writing_to_the_old_one(sentinels):
    """SENTINEL FAILOVER leaves the old primary up and accepting writes until the Sentinels
    demote it; a worker's long-lived client must not write there meanwhile (those writes are
    lost at the demotion). ``follow_primary``, which the worker calls at every tick and before
    each claim, moves its idle connections to the new primary."""
    from jobs.core.store.connection import follow_primary

    client = connect(sentinels.url())
    client.set("before", 1)
    old = sentinels.primary_address()
    sentinels.sentinel_failover()
    wait_for(lambda: sentinels.primary_address() not in (None, old), 30, message="the switch")
    old_primary = redis.Redis(port=old[1])
    assert old_primary.info("replication")["role"] == "master", "demoted already: nothing to show"
    follow_primary(client)
    client.set("after", 1)
    new = sentinels.primary_address()
    assert redis.Redis(port=new[1]).get("after") == b"1"
    assert old_primary.info("replication")["role"] == "slave" or old_primary.get("after") is None
