"""The model backend's parts, in process against a real Redis and the fake HTTP server:
Retry-After parsing, label matching, error messages, template validation, the shared rate
limit's arithmetic, and ``ctx.keepalive`` / ``ctx.sleep`` on a real lease."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from email.utils import formatdate

import pytest

from jobs import keys
from jobs.core import control, lease
from jobs.core.running.context import JobContext
from jobs.enqueue import enqueue
from jobs.errors import Canceled, InvalidJob, LeaseLost, PermanentError, ProviderDown
from jobs.models import backends
from jobs.models.openai_backend import ModelUnavailable, OpenAIBackend, match_label, retry_after_seconds
from jobs.models.outage import OutageWatch
from jobs.models.rate import ACQUIRED, PAUSED, TOKENS_SPENT, ModelRateLimit
from tests.conftest import REDIS_URL, ROOT, wait_for
from tests.fake_openai import Error


def test_retry_after_is_read_as_seconds_milliseconds_or_an_http_date():
    assert retry_after_seconds({"retry-after": "7"}) == 7.0
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "7"}) == 1.5
    now = 1_700_000_000.0
    assert retry_after_seconds({"retry-after": formatdate(now + 20, usegmt=True)}, now=now) == pytest.approx(20)
    assert retry_after_seconds({"retry-after": formatdate(now - 20, usegmt=True)}, now=now) == 0.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


def test_an_answer_names_a_label_despite_case_quotes_periods_and_thinking():
    labels = ["positive", "negative", "Needs Review"]
    assert match_label("positive", labels) == "positive"
    assert match_label(" 'Negative'.\n", labels) == "negative"
    assert match_label("needs review", labels) == "Needs Review"
    assert match_label("<think>hmm, maybe negative</think>positive", labels) == "positive"
    assert match_label("I think it is positive", labels) is None
    assert match_label("", labels) is None


def test_the_backend_is_chosen_by_configuration(env):
    env.delenv("LEASH_MODEL_BACKEND", raising=False)
    env.delenv("LEASH_MODEL_URL", raising=False)
    assert backends.backend_name() == "local"
    env.setenv("LEASH_MODEL_URL", "http://127.0.0.1:9/v1")
    assert backends.backend_name() == "openai"
    env.setenv("LEASH_MODEL_BACKEND", "local")
    assert backends.backend_name() == "local"
    env.setenv("LEASH_MODEL_BACKEND", "nonsense")
    with pytest.raises(PermanentError, match="choose one of"):
        backends.get_backend()


PRELOAD_PROBE = """
import logging, sys
import redis
from jobs.worker.leash_worker import LeashWorker
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
assert "openai" not in sys.modules and "anthropic" not in sys.modules
LeashWorker(["leash"], connection=redis.Redis.from_url(sys.argv[1]))
print("openai loaded:", "openai" in sys.modules, "with its chat client:", "openai.resources.chat" in sys.modules)
print("anthropic loaded:", "anthropic" in sys.modules, "with its messages client:",
      "anthropic.resources.messages" in sys.modules)
"""
NO_ANTHROPIC = "anthropic loaded: False with its messages client: False"
NO_OPENAI = "openai loaded: False with its chat client: False"


@pytest.mark.parametrize("backend, says", [
    # LEASH_MODEL_URL is set: imported before any fork
    ("", f"openai loaded: True with its chat client: True\n{NO_ANTHROPIC}"),
    ("anthropic", f"{NO_OPENAI}\nanthropic loaded: True with its messages client: True"),
    ("local", f"{NO_OPENAI}\n{NO_ANTHROPIC}"),
    ("nonsense", "LEASH_MODEL_BACKEND='nonsense' is unknown; choose one of ['anthropic', 'local', 'openai']: model "
                 f"jobs on this worker will fail until it is fixed\n{NO_OPENAI}\n{NO_ANTHROPIC}"),
])
def test_a_worker_imports_its_model_backend_once_before_it_forks(conn, backend, says):
    probe_env = {**os.environ, "LEASH_MODEL_URL": "http://127.0.0.1:9/v1", "LEASH_MODEL_BACKEND": backend,
                 "PYTHONPATH": str(ROOT)}
    probe = subprocess.run([sys.executable, "-c", PRELOAD_PROBE, REDIS_URL], env=probe_env, cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == says


@pytest.mark.parametrize("status, message, says", [
    (401, "Incorrect API key provided", "set LEASH_MODEL_API_KEY"),
    (402, "Your credit balance is too low", "add credit to the account"),
    (403, "not allowed", "may not use model 'fake-model'"),
    (404, "The model `fake-model` does not exist", "set LEASH_MODEL_NAME"),
    (400, "This model's maximum context length is 8192 tokens", "shorten the items"),
    (422, "bad field", "rejected the request (HTTP 422)"),
])
def test_client_errors_are_permanent_and_say_what_to_fix(conn, provider_server, status, message, says):
    provider_server.on("x", Error(status, message))
    with pytest.raises(PermanentError) as raised:
        backends.get_backend().complete("x")
    assert says in str(raised.value)
    assert message in str(raised.value)


@pytest.mark.parametrize("status, message, says", [
    (400, "prompt is too long: 212345 tokens > 200000 maximum", "shorten the items"),
    (413, "Request exceeds the maximum allowed number of bytes.", "shorten the items"),
    (404, "model: claude-nonsense", "without /v1, e.g. https://api.anthropic.com"),
])
def test_anthropics_own_words_for_a_long_prompt_and_a_wrong_url_say_what_to_fix(
        conn, anthropic_server, status, message, says):
    anthropic_server.on("x", Error(status, message))
    with pytest.raises(PermanentError) as raised:
        backends.get_backend().complete("x")
    assert says in str(raised.value) and message in str(raised.value)


@pytest.mark.parametrize("status", [500, 503, 504])
def test_server_errors_are_sent_again_then_waited_out_as_an_outage(conn, provider_server, status):
    provider_server.on("x", Error(status, "overloaded"))
    assert backends.get_backend().complete("x") == "echo: x"  # sent again after a second
    provider_server.on("x", Error(status, "overloaded"), times=3)
    with pytest.raises(ProviderDown, match=f"every call failed: .*failed \\(HTTP {status}\\): overloaded"):
        backends.get_backend().complete("x")
    assert len(provider_server.seen("x")) == 5


def test_a_refused_connection_every_time_is_an_outage(conn, provider_server, env):
    env.setenv("LEASH_MODEL_URL", "http://127.0.0.1:9/v1")  # nothing listens on port 9
    with pytest.raises(ProviderDown, match="cannot reach the model server"):
        backends.get_backend().complete("x")


def test_a_call_that_keeps_failing_while_others_are_answered_fails_its_attempt():
    watch = OutageWatch()
    assert watch.failed("boom", 1, ModelUnavailable) == 1.0
    watch.answered()  # another item's call was answered meanwhile
    assert watch.failed("boom", 2, ModelUnavailable) == 2.0
    watch.answered()
    with pytest.raises(ModelUnavailable, match="boom"):
        watch.failed("boom", 3, ModelUnavailable)


def test_anthropics_529_overloaded_waits_like_a_429_and_halves_the_limit(conn, anthropic_server, env):
    env.setenv("LEASH_ITEM_CONCURRENCY", "8")
    anthropic_server.on("x", Error(529, "Overloaded", headers={"retry-after": "1"}))
    assert backends.get_backend().complete("x") == "echo: x"
    refused, answered = anthropic_server.seen("x")
    assert 1.0 <= answered.at - refused.at < 3.0
    assert conn.hget(keys.model_concurrency("fake-model"), "limit") == b"4"


def test_missing_or_bad_model_settings_are_permanent_errors(conn, model_server, env):
    env.delenv("LEASH_MODEL_NAME")
    with pytest.raises(PermanentError, match="LEASH_MODEL_NAME is not set"):
        OpenAIBackend()
    env.setenv("LEASH_MODEL_NAME", "m")
    env.setenv("LEASH_MODEL_RPM", "lots")
    with pytest.raises(PermanentError, match="LEASH_MODEL_RPM must be a number"):
        OpenAIBackend()


@pytest.mark.parametrize("payload, complaint", [
    ({"items": ["a"], "template": "no placeholder"}, "must contain {item}"),
    ({"items": ["a"], "template": ""}, "non-empty string"),
    ({"items": ["a"], "template": "{item}" + "x" * 20_000}, "at most 20000"),
    ({"items": [], "template": "{item}"}, "'items' is empty"),
    ({"items": [3], "template": "{item}"}, "must be a string"),
])
def test_prompt_jobs_are_validated_before_anything_is_written(conn, payload, complaint):
    with pytest.raises(InvalidJob, match=complaint):
        enqueue(conn, "prompt", payload)
    assert conn.dbsize() == 0


def test_the_rate_limit_spaces_requests_evenly_across_callers(conn):
    a = ModelRateLimit(conn, "m", rpm=120)
    b = ModelRateLimit(conn, "m", rpm=120)  # another worker, same model: same budget
    t = 5_000_000
    waits = [limit.acquire(max_pause=30, now_ms=t).wait_seconds for limit in (a, b, a, b)]
    assert waits == [0.0, 0.5, 1.0, 1.5]
    assert a.acquire(max_pause=30, now_ms=t + 10_000).wait_seconds == 0.0  # idle time is not banked


def test_tokens_used_hold_back_the_next_call_until_paid_off(conn):
    limit = ModelRateLimit(conn, "m", rpm=0, tpm=600)  # 10 tokens a second
    t = 5_000_000
    assert limit.acquire(30, now_ms=t).code == ACQUIRED
    limit.spend(50, now_ms=t)
    turn = limit.acquire(30, now_ms=t + 1000)
    assert (turn.code, turn.wait_seconds) == (TOKENS_SPENT, 4.0)
    assert limit.acquire(30, now_ms=t + 5000).code == ACQUIRED


def test_a_429_pause_holds_every_caller_and_a_long_one_is_not_sat_out(conn):
    limit = ModelRateLimit(conn, "m", rpm=60)
    t = 5_000_000
    limit.pause(3, now_ms=t)
    turn = limit.acquire(max_pause=30, now_ms=t)
    assert (turn.code, turn.wait_seconds) == (ACQUIRED, 3.0)
    limit.pause(40, now_ms=t)
    turn = limit.acquire(max_pause=30, now_ms=t)
    assert (turn.code, turn.wait_seconds) == (PAUSED, 40.0)
    assert conn.get(keys.model_rate("m", "requests")) == str(t + 4000).encode()  # nothing reserved


def _running_attempt(conn) -> lease.Attempt:
    job_id, _ = enqueue(conn, "noop", {})
    attempt = lease.claim(conn, job_id, "leash", "test-worker")
    assert attempt is not None
    return attempt


def _lease_expires_at(conn, job_id) -> float:
    return float(conn.hget(keys.job(job_id), "lease_expires_at"))


def test_keepalive_renews_the_lease_while_a_call_runs(conn):
    attempt = _running_attempt(conn)  # lease: 2 s (the env fixture)
    ctx = JobContext(attempt, {})
    first = _lease_expires_at(conn, attempt.job_id)
    with ctx.keepalive(timeout=30):
        # Stands in for a slow call: the block lasts until the lease has outlived its first term.
        wait_for(lambda: time.time() > first + 1, 10)
        assert _lease_expires_at(conn, attempt.job_id) > time.time()
    assert conn.hget(keys.job(attempt.job_id), "state") == b"running"


def test_keepalive_stops_renewing_after_its_timeout_so_a_hung_call_loses_the_lease(conn):
    attempt = _running_attempt(conn)
    ctx = JobContext(attempt, {})
    with ctx.keepalive(timeout=1):
        wait_for(lambda: _lease_expires_at(conn, attempt.job_id) < time.time(), 6,
                 message="the lease to run out once the keepalive gave up")
    expired_at = _lease_expires_at(conn, attempt.job_id)
    assert expired_at <= attempt_started(conn, attempt) + 1 + attempt.lease_seconds + 0.5


def attempt_started(conn, attempt) -> float:
    return float(conn.hget(keys.job(attempt.job_id), "started_at"))


def test_keepalive_raises_lease_lost_when_the_block_ends(conn):
    attempt = _running_attempt(conn)
    ctx = JobContext(attempt, {})
    with pytest.raises(LeaseLost):
        with ctx.keepalive(timeout=30):
            lease.reclaim(conn, attempt.job_id, "leash", "taken back by the test", token=attempt.token)
            wait_for(lambda: attempt.outcome == "superseded", 5, message="the keepalive thread to notice")


def test_keepalive_raises_canceled_when_the_block_ends(conn):
    attempt = _running_attempt(conn)
    ctx = JobContext(attempt, {})
    with pytest.raises(Canceled):
        with ctx.keepalive(timeout=30):
            control.cancel(conn, attempt.job_id)
            first = _lease_expires_at(conn, attempt.job_id)
            wait_for(lambda: _lease_expires_at(conn, attempt.job_id) > first, 5, message="a heartbeat")


def test_sleep_keeps_the_lease_alive(conn):
    attempt = _running_attempt(conn)
    ctx = JobContext(attempt, {})
    started = time.time()
    ctx.sleep(3)  # longer than the 2 s lease
    assert _lease_expires_at(conn, attempt.job_id) > started + 3
    assert conn.hget(keys.job(attempt.job_id), "state") == b"running"
