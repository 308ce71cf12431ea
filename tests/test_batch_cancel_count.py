"""A canceled batch job counts what its provider ran before the cancel: on leash workers (real
``leash worker`` processes but for the replay, run in the test's process) against the loopback
providers' batch APIs, through the official SDKs. The job ends canceled at once; once the
canceled batch has ended, the usage of every request it answered is counted at the batch price
(job, owner's day, model) and nothing is stored; a batch that never ends is given up after
LEASH_BATCH_CANCEL_GRACE with one WARNING; a deploy mid-count, a look repeated or two at once
count once; a replay does not count the batch again."""

from __future__ import annotations

import importlib
import signal
import threading

import pytest
from click.testing import CliRunner

from cli import main
from jobs import keys
from jobs.batch import canceled as canceled_batch
from jobs.core import clock, states
from jobs.usage.meter import utc_day
from tests.conftest import batch_settings, wait_for
from tests.test_batch_jobs import FOLLOW, only_batch, submit_batch, waiting

pytestmark = pytest.mark.slow

PRICES = '{"fake-model": {"input": 1.0, "output": 2.0}}'


@pytest.fixture
def any_provider(env, provider_server):
    """Each provider's loopback server (OpenAI's Batch API, Anthropic's Message Batches)."""
    env.setenv("LEASH_MODEL_PRICES", PRICES)
    return batch_settings(env, provider_server)


def _cancel(conn, job_id: str) -> None:
    result = CliRunner().invoke(main, ["cancel", job_id])  # `leash cancel`
    assert result.exit_code == 0 and "its batch at the provider too" in result.output, result.output
    status = states.status(conn, job_id)
    assert status["state"] == "failed" and status["canceled"], status


def _calls(conn, key: str) -> int:
    return int(conn.hget(key, "calls") or 0)


def _job_calls(conn, job_id: str) -> int:
    return int(conn.hget(keys.job(job_id), "usage_calls") or 0)


def _no_look_left(conn) -> bool:
    """No look at a canceled batch is scheduled, queued or running."""
    scheduled = conn.zcard(keys.rq_scheduled("leash", conn))
    running = conn.zcard(keys.rq_started("leash", conn))
    return scheduled == 0 and conn.llen(keys.rq_queue("leash")) == 0 and running == 0


def _batch_cost(billed) -> float:
    return sum(p * 1.0 + c * 2.0 for p, c in billed) / 1e6 * 0.5  # at the batch multiplier


def test_requests_a_canceled_batch_answered_before_the_cancel_are_counted_at_the_batch_price(
        conn, workers, any_provider):
    server = any_provider
    job_id, _ = submit_batch(conn, "c", 10)
    workers.start()
    workers.start()  # two workers: either may look, the count is one
    waiting(conn, job_id)
    batch_id = only_batch(server)
    server.batches.run_first(batch_id, 4)  # the provider had run 4 requests when the cancel came
    _cancel(conn, job_id)
    assert _job_calls(conn, job_id) == 0
    server.batches.advance(batch_id)  # the canceled batch ends: 4 answered and billed, 6 canceled
    wait_for(lambda: _job_calls(conn, job_id) == 4, 30, message="the 4 answered requests counted")
    wait_for(lambda: _no_look_left(conn), 30, message="the looks at the canceled batch to stop")

    billed = server.batches.batch_billed
    assert len(billed) == 4 and len(server.requests) == 0
    status = states.status(conn, job_id)
    assert status["state"] == "failed" and status["canceled"] and status["done"] == 0  # canceled, nothing stored
    assert conn.hlen(keys.items(job_id)) == 0
    assert (status["usage"]["calls"], status["usage"]["input_tokens"], status["usage"]["output_tokens"]) == (
        4, sum(p for p, _ in billed), sum(c for _, c in billed))
    assert status["cost_usd"] == pytest.approx(_batch_cost(billed))
    owner = conn.hget(keys.job(job_id), "owner").decode()
    assert _calls(conn, keys.usage_owner_day(owner, utc_day(clock.wall()))) == 4
    assert _calls(conn, keys.usage_model("fake-model")) == 4
    assert int(conn.hget(keys.job(job_id), "reserved_tokens") or 0) == 0


def test_a_canceled_batch_that_never_ends_is_given_up_after_the_grace_with_one_warning(
        conn, workers, any_provider, env, tmp_path):
    server = any_provider
    env.setenv("LEASH_BATCH_CANCEL_GRACE", "3")
    job_id, _ = submit_batch(conn, "g", 6)
    with open(tmp_path / "worker.log", "w") as log:
        workers.start(stderr=log)
        workers.start(stderr=log)
        waiting(conn, job_id)
        batch_id = only_batch(server)
        server.batches.run_first(batch_id, 3)
        _cancel(conn, job_id)
        wait_for(lambda: conn.hexists(keys.provider_batches(job_id), canceled_batch.GAVE_UP), 30,
                 message="the canceled batch to be given up")
        wait_for(lambda: _no_look_left(conn), 30, message="the looks at the canceled batch to stop")
    assert server.batches.batch(batch_id).canceling and not server.batches.batch(batch_id).ending
    assert _job_calls(conn, job_id) == 0
    assert states.status(conn, job_id)["canceled"]
    text = (tmp_path / "worker.log").read_text()
    assert text.count("did not end within LEASH_BATCH_CANCEL_GRACE (3s) of the cancel") == 1, text


def _hold_results(server):
    """The fake provider stops inside the first read of a batch's results until released."""
    inside, release = threading.Event(), threading.Event()
    original = server.batches.poll_error

    def held(handler, results: bool = False):
        if results and not release.is_set():
            inside.set()
            release.wait(20)
        return original(handler, results=results)

    server.batches.poll_error = held
    return inside, release


def test_a_deploy_while_the_canceled_batch_is_read_counts_it_once(conn, workers, any_provider):
    server = any_provider
    job_id, _ = submit_batch(conn, "d", 8)
    first = workers.start()
    waiting(conn, job_id)
    batch_id = only_batch(server)
    server.batches.run_first(batch_id, 5)
    _cancel(conn, job_id)
    reading, release = _hold_results(server)
    server.batches.advance(batch_id)
    assert reading.wait(30)
    first.send_signal(signal.SIGTERM)  # the deploy arrives while the look reads the results
    release.set()
    assert first.wait(30) == 0
    workers.start()  # the new release's worker
    wait_for(lambda: _job_calls(conn, job_id) == 5, 30, message="the 5 answered requests counted")
    wait_for(lambda: _no_look_left(conn), 30, message="the looks at the canceled batch to stop")
    assert _job_calls(conn, job_id) == 5 and len(server.batches.batch_billed) == 5
    assert states.status(conn, job_id)["cost_usd"] == pytest.approx(_batch_cost(server.batches.batch_billed))


def test_a_look_repeated_or_two_at_once_count_the_batch_once(conn, workers, any_provider):
    """A look whose worker died after its write, run again, and two looks at once (a duplicate
    look), each read the whole batch: its usage write is counted once."""
    from jobs.models import backends

    server = any_provider
    job_id, _ = submit_batch(conn, "t", 6)
    worker = workers.start()
    waiting(conn, job_id)
    batch_id = only_batch(server)
    server.batches.run_first(batch_id, 2)
    worker.send_signal(signal.SIGTERM)  # no worker looks: this test does
    assert worker.wait(30) == 0
    _cancel(conn, job_id)
    server.batches.advance(batch_id)
    canceled_at = clock.wall()

    def look():
        canceled_batch.look(conn, backends.get_backend(), job_id, [batch_id], canceled_at)

    threads = [threading.Thread(target=look) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    conn.hdel(keys.provider_batches(job_id), canceled_batch.COUNTED + batch_id)  # as if it died before its marker
    look()
    assert _job_calls(conn, job_id) == 2
    assert _calls(conn, keys.usage_model("fake-model")) == 2


def test_the_look_rq_runs_is_where_its_stored_path_says():
    """RQ stores the look's dotted path in every scheduled look: it must resolve."""
    module, _, name = canceled_batch.LOOK.rpartition(".")
    assert callable(getattr(importlib.import_module(module), name))


def test_a_replay_after_the_count_asks_the_items_directly_and_counts_the_batch_once(conn, burst, any_provider):
    from tests.test_items_workers import ended, stored

    server = any_provider
    job_id, _ = submit_batch(conn, "r", 6)
    burst()
    waiting(conn, job_id)
    batch_id = only_batch(server)
    server.batches.run_first(batch_id, 2)
    _cancel(conn, job_id)
    server.batches.advance(batch_id)
    burst(follow=FOLLOW)
    wait_for(lambda: _job_calls(conn, job_id) == 2, 30, message="the 2 answered requests counted")
    result = CliRunner().invoke(main, ["replay", "--", job_id])
    assert result.exit_code == 0, result.output
    burst(follow=FOLLOW)
    final = ended(conn, job_id)
    assert final["state"] == "succeeded", final["error"]
    assert stored(conn, job_id) == {i: f"echo: Say r{i}" for i in range(6)}
    assert len(server.requests) == 6 and server.batches.created == 1  # the canceled batch is not read again
    assert final["usage"]["calls"] == 2 + 6  # what the canceled batch answered, then the direct calls


def test_a_look_whose_work_horse_is_killed_mid_read_is_looked_at_again_and_counts_once(conn, workers, any_provider):
    import os
    from urllib.parse import urlsplit

    import psutil

    server = any_provider
    job_id, _ = submit_batch(conn, "k", 7)
    worker = workers.start()
    waiting(conn, job_id)
    batch_id = only_batch(server)
    server.batches.run_first(batch_id, 3)
    _cancel(conn, job_id)
    reading, release = _hold_results(server)
    server.batches.advance(batch_id)
    assert reading.wait(30)
    port = urlsplit(server.url).port

    def reader():  # the work-horse: the worker's child talking to the provider
        for pid in workers.children(worker):
            try:
                if any(c.raddr and c.raddr.port == port for c in psutil.Process(pid).net_connections("tcp")):
                    return pid
            except psutil.NoSuchProcess:
                continue
        return None

    os.kill(wait_for(reader, 10, message="the work-horse reading the batch"), signal.SIGKILL)
    release.set()
    wait_for(lambda: _job_calls(conn, job_id) == 3, 30, message="the next look to count the 3 answers")
    wait_for(lambda: _no_look_left(conn), 30, message="the looks at the canceled batch to stop")
    assert _job_calls(conn, job_id) == 3 and len(server.batches.batch_billed) == 3
