"""Batch mode's looks on leash workers (real ``leash worker`` processes but for a forgotten batch,
run in the test's process) against the loopback providers' batch APIs, through the official
SDKs: past the longest wait the canceled batch's answers are read (billed once, at the batch
price) and only the rest runs direct, also across a deploy; a canceled batch that does not end
within the grace leaves the rest direct; a look the provider fails to answer is looked at again
without failing the attempt; a batch the provider no longer has fails the job, and a replay asks
its items directly."""

from __future__ import annotations

import signal

import pytest
from click.testing import CliRunner

from cli import main
from jobs import keys
from jobs.batch import looks as batch_looks
from jobs.core import clock, states
from tests.conftest import wait_for
from tests.test_batch_jobs import FOLLOW, only_batch, submit_batch, waiting
from tests.test_items_workers import ended, stored

pytestmark = pytest.mark.slow


def _phase(conn, job_id, phase: str, timeout: float = 30) -> dict:
    return wait_for(lambda: (s := states.status(conn, job_id))["batch"] and s["batch"]["phase"] == phase and s,
                    timeout, message=f"job {job_id} in phase {phase}")


def _cost(billed, price_in: float, price_out: float) -> float:
    return sum(p * price_in + c * price_out for p, c in billed) / 1e6


def test_past_the_longest_wait_what_the_canceled_batch_answered_is_read_and_only_the_rest_runs_direct(
        conn, workers, any_provider, env):
    server = any_provider
    env.setenv("LEASH_MODEL_PRICES", '{"fake-model": {"input": 1.0, "output": 2.0}}')
    env.setenv("LEASH_BATCH_MAX_WAIT", "3")
    job_id, _ = submit_batch(conn, "m", 10)
    workers.start()
    waiting(conn, job_id)
    batch_id = only_batch(server)
    server.batches.run_first(batch_id, 6)  # the provider answers 6 before the cancel reaches it
    canceling = _phase(conn, job_id, "canceling")
    assert server.batches.batch(batch_id).canceling and canceling["state"] == "running"
    assert canceling["batch"]["next_look_at"] and "canceled at the provider" in canceling["waiting"]
    assert len(server.requests) == 0  # nothing asked directly while the canceled batch ends
    server.batches.advance(batch_id)  # the cancel completes: 6 answered (and billed), 4 canceled
    final = ended(conn, job_id)

    assert final["state"] == "succeeded", final["error"]
    assert stored(conn, job_id) == {i: f"echo: Say m{i}" for i in range(10)}
    assert len(server.batches.batch_billed) == 6
    assert final["batch"]["direct"] == 4 and len(server.requests) == 4 and len(server.billed) == 4
    assert final["attempts"] == 1 and final["usage"]["calls"] == 10
    assert final["cost_usd"] == pytest.approx(_cost(server.batches.batch_billed, 1.0, 2.0) * 0.5
                                              + _cost(server.billed, 1.0, 2.0))


def test_a_deploy_while_the_canceled_batch_ends_changes_nothing(conn, workers, batch_env, env):
    server = batch_env
    env.setenv("LEASH_BATCH_MAX_WAIT", "2")
    job_id, _ = submit_batch(conn, "d", 8)
    first = workers.start()
    waiting(conn, job_id)
    batch_id = only_batch(server)
    server.batches.run_first(batch_id, 5)
    _phase(conn, job_id, "canceling")
    first.send_signal(signal.SIGTERM)  # a deploy: the cancel's time is in the job's batch record
    assert first.wait(30) == 0
    server.batches.advance(batch_id)
    workers.start()
    final = ended(conn, job_id)
    assert final["state"] == "succeeded", final["error"]
    assert final["attempts"] == 1 and final["batch"]["direct"] == 3 and len(server.requests) == 3
    assert len(server.batches.batch_billed) == 5 and server.batches.created == 1
    assert stored(conn, job_id) == {i: f"echo: Say d{i}" for i in range(8)}


def test_a_canceled_batch_that_does_not_end_within_the_grace_leaves_the_rest_direct(
        conn, workers, batch_env, env, tmp_path):
    server = batch_env
    env.setenv("LEASH_BATCH_MAX_WAIT", "2")
    env.setenv("LEASH_BATCH_CANCEL_GRACE", "2")
    job_id, _ = submit_batch(conn, "g", 8)
    with open(tmp_path / "worker.log", "w") as log:
        workers.start(stderr=log)
        _phase(conn, job_id, "canceling")
        assert len(server.requests) == 0
        final = ended(conn, job_id)  # the provider never ends the canceled batch
    assert final["state"] == "succeeded", final["error"]
    assert server.batches.batch(only_batch(server)).canceling and not server.batches.batch(only_batch(server)).ending
    assert final["batch"]["direct"] == 8 and len(server.requests) == 8
    assert stored(conn, job_id) == {i: f"echo: Say g{i}" for i in range(8)}
    text = (tmp_path / "worker.log").read_text()
    assert text.count("did not end within LEASH_BATCH_CANCEL_GRACE") == 1, text


def test_looks_the_provider_fails_to_answer_are_looked_at_again_without_failing_the_attempt(
        conn, workers, any_provider):
    server = any_provider
    job_id, _ = submit_batch(conn, "r", 6, max_attempts=3)
    workers.start()
    waiting(conn, job_id)
    server.batches.fail_polls([500] * 4 + [429] * 4)  # two looks fail, each after the SDK's own 3 retries
    seen = wait_for(lambda: (s := states.status(conn, job_id))["batch"].get("failed_looks") == 2
                    and s["batch"]["phase"] == "waiting" and s, 60, message="two failed looks in status")
    assert seen["state"] == "running" and seen["attempts"] == 1 and not seen["stale"]
    assert "the last 2 look(s) failed" in seen["waiting"]
    assert server.batches.poll_errors_sent == 8
    server.batches.fail_results([503] * 4)  # the batch has ended, and reading its results fails once
    server.batches.complete(only_batch(server))
    final = ended(conn, job_id)
    assert final["state"] == "succeeded", final["error"]
    assert final["attempts"] == 1 and [h["ended"] for h in final["history"]] == ["succeeded"]
    assert len(server.requests) == 0 and server.batches.created == 1  # no direct call, no second batch
    assert final["batch"]["failed_looks"] == 0 and final["batch"]["direct"] == 0
    assert server.batches.result_errors_sent == 4 and len(server.batches.batch_billed) == 6
    assert stored(conn, job_id) == {i: f"echo: Say r{i}" for i in range(6)}


def test_a_batch_the_provider_no_longer_has_fails_the_job_and_a_replay_asks_its_items_directly(
        conn, burst, batch_env):
    server = batch_env
    job_id, _ = submit_batch(conn, "n", 5, max_attempts=3)
    burst()
    waiting(conn, job_id)
    server.batches.forget(only_batch(server))  # deleted at the provider: every read is a 404
    burst(follow=FOLLOW)
    final = ended(conn, job_id)
    assert final["state"] == "failed" and final["attempts"] == 1, (final["attempts"], final["error"])
    assert "could not look at the provider's batch" in final["error"] and "404" in final["error"]
    assert len(server.requests) == 0
    result = CliRunner().invoke(main, ["replay", "--", job_id])
    assert result.exit_code == 0, result.output
    burst(follow=FOLLOW)
    replayed = wait_for(lambda: (s := states.status(conn, job_id))["state"] == "succeeded" and s, 60,
                        message="the replayed job to succeed")
    assert replayed["batch"]["direct"] == 5 and len(server.requests) == 5 and server.batches.created == 0
    assert stored(conn, job_id) == {i: f"echo: Say n{i}" for i in range(5)}


def test_looks_back_off_as_the_wait_grows_within_the_two_settings(env):
    env.setenv("LEASH_BATCH_POLL_SECONDS", "60")
    env.setenv("LEASH_BATCH_POLL_MAX", "900")
    gaps = [batch_looks.next_look_in(waited) for waited in (0, 300, 600, 3600, 7200, 86400)]
    assert gaps == [60, 60, 60, 360, 720, 900]
    assert batch_looks.next_look_in(86400, batch_looks.CANCELING) == 60  # a canceled batch ends in minutes
    waited = looks = 0.0
    while waited < 86400:  # a day's wait
        waited += batch_looks.next_look_in(waited)
        looks += 1
    assert looks <= 130  # against 1,440 at one look a minute


def test_a_batch_that_has_waited_long_is_looked_at_less_often(conn, workers, batch_env, env):
    env.setenv("LEASH_BATCH_POLL_MAX", "120")
    job_id, _ = submit_batch(conn, "m", 3)
    workers.start()
    waiting(conn, job_id)
    # As if the batch had been sent 50 minutes ago: its next look is in a tenth of that, at
    # most LEASH_BATCH_POLL_MAX (120 s), not LEASH_BATCH_POLL_SECONDS.
    conn.hset(keys.provider_batches(job_id), "first_at", repr(clock.wall() - 3000))
    before = conn.hget(keys.job(job_id), "look_at")
    look_at = wait_for(lambda: (v := conn.hget(keys.job(job_id), "look_at")) not in (None, b"", before) and v, 30,
                       message="the next look")
    gap = float(look_at) - clock.wall()
    assert 100 < gap <= 120, gap
    later = states.status(conn, job_id)
    assert later["state"] == "running" and later["attempts"] == 1 and later["batch"]["phase"] == "waiting"
