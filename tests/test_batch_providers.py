"""The batch side of the OpenAI and Anthropic backends, against the fake servers' batch endpoints
over real loopback HTTP, through the official SDKs: create, poll through the states, results
read like direct answers, limits, partial failures, expiry, cancel, and finding a batch a
crashed worker created without recording it."""

from __future__ import annotations

import time

import pytest

from jobs.models import backends
from jobs.models.batch_api.batching import BATCH_GONE, LOOK_AGAIN, NOT_RUN, BatchLimits, custom_id, item_index
from jobs.models.provider import COMPLETE, CUT_OFF, PERMANENT, RATE_LIMITED, UNAVAILABLE, Answer, CallRequest, Failure
from tests.fake_openai import Error, Reply

JOB = "Jb7x_Q-2kLmNoPqRsTuVwXyZ"  # a job id as leash makes them (secrets.token_urlsafe(18))
MAX_POLLS = 20


def items(count: int, job: str = JOB, word: str = "item") -> list:
    return [(custom_id(job, i), CallRequest([{"role": "user", "content": f"{word} {i} -> answer{i}"}], 50))
            for i in range(count)]


def poll_to_end(backend, batch_id: str) -> list[str]:
    """The statuses seen, polling until the batch ends (bounded)."""
    seen = []
    for _ in range(MAX_POLLS):
        progress = backend.batch_poll(batch_id)
        seen.append(progress.status)
        if progress.ended:
            return seen
    raise AssertionError(f"batch {batch_id} did not end in {MAX_POLLS} polls: {seen}")


def results(backend, batch_id: str) -> dict:
    return {name: (outcome, usage) for name, outcome, usage in backend.batch_results(batch_id)}


@pytest.fixture
def backend(conn, provider_server):
    return backends.get_backend()


def test_a_batch_moves_through_its_states_and_answers_each_item_as_a_direct_call_would(backend, provider_server):
    batch_id = backend.batch_create(JOB, 1, 0, items(3))
    assert provider_server.batches.created == 1
    statuses = poll_to_end(backend, batch_id)
    assert statuses == (["in_progress", "finalizing", "completed"] if provider_server.BACKEND == "openai"
                        else ["in_progress", "in_progress", "ended"])
    progress = backend.batch_poll(batch_id)
    assert (progress.ended, progress.done, progress.failed, progress.total) == (True, 3, 0, 3)
    assert progress.expires_at and progress.expires_at > time.time()
    got = results(backend, batch_id)
    assert sorted(got) == [custom_id(JOB, i) for i in range(3)]
    for name, (answer, usage) in got.items():
        assert isinstance(answer, Answer) and answer.text == f"answer{item_index(name)}" and answer.finish == COMPLETE
        assert usage.batch and usage == answer.usage and usage.input_tokens > 0 and not usage.estimated
    # One batch and no direct call: every answer came from the batch.
    assert provider_server.billed == [] and len(provider_server.batches.batch_billed) == 3
    # A batch line's body is exactly what a direct call sends.
    backend.complete("item 0 -> answer0", max_tokens=50)
    assert provider_server.batches.batch(batch_id).requests[0][1] == provider_server.requests[-1].body


def test_items_are_split_by_the_batch_limits_and_an_oversized_batch_is_refused(backend, provider_server):
    assert backend.supports_batch
    assert backend.batch_limits.max_requests == (50_000 if provider_server.BACKEND == "openai" else 100_000)
    backend.batch_limits = BatchLimits(max_requests=2, max_bytes=10**6)
    parts = backend.batch_split(items(5))
    assert [[item_index(name) for name, _ in part] for part in parts] == [[0, 1], [2, 3], [4]]
    one_line = backend._line_size(items(1)[0])
    backend.batch_limits = BatchLimits(max_requests=100, max_bytes=one_line * 3)
    assert [len(part) for part in backend.batch_split(items(7))] == [3, 3, 1]
    with pytest.raises(ValueError, match="exceed the batch limit"):
        backend.batch_create(JOB, 1, 0, items(4))
    with pytest.raises(ValueError, match="custom_id"):
        backend.batch_create(JOB, 1, 0, [("bad id!", items(1)[0][1])])
    assert provider_server.batches.created == 0


def test_per_request_errors_map_as_direct_errors_do(backend, provider_server):
    batch = items(5)
    provider_server.batches.fail([batch[1][0]], 503)
    provider_server.on("item 2 -> answer2", Error(400, "messages: something is wrong"))
    provider_server.on("item 3 -> answer3", Error(429, "slow down"))
    provider_server.on("item 4 -> answer4", Reply(finish_reason=provider_server.cut_off))
    batch_id = backend.batch_create(JOB, 1, 0, batch)
    poll_to_end(backend, batch_id)
    progress = backend.batch_poll(batch_id)
    assert (progress.done, progress.failed) == (2, 3)
    got = {item_index(name): outcome for name, (outcome, _) in results(backend, batch_id).items()}
    assert isinstance(got[0], Answer) and got[0].finish == COMPLETE
    assert isinstance(got[4], Answer) and got[4].finish == CUT_OFF
    # Anthropic's errored result names only an error type (api_error), not the status.
    assert got[1].kind == UNAVAILABLE and "the server had an error" in got[1].message
    assert got[2].kind == PERMANENT and "something is wrong" in got[2].message
    assert got[3].kind == RATE_LIMITED
    if provider_server.BACKEND == "openai":  # answered lines in the output file, errors in the error file
        shape = provider_server.batches.shape(provider_server.batches.batch(batch_id))
        assert shape["output_file_id"] and shape["error_file_id"]


def test_an_expired_batch_answers_what_it_ran_and_the_rest_are_not_run(backend, provider_server):
    provider_server.batches.auto = False
    batch_id = backend.batch_create(JOB, 1, 0, items(4))
    provider_server.batches.advance(batch_id)
    assert not backend.batch_poll(batch_id).ended
    provider_server.batches.expire(batch_id, done=2)
    progress = backend.batch_poll(batch_id)
    assert progress.ended and progress.status == ("expired" if provider_server.BACKEND == "openai" else "ended")
    assert (progress.done, progress.failed) == (2, 2)
    got = {item_index(name): outcome for name, (outcome, _) in results(backend, batch_id).items()}
    assert [type(got[i]) for i in range(4)] == [Answer, Answer, Failure, Failure]
    assert got[2].kind == got[3].kind == NOT_RUN and "expired" in got[3].message


def test_a_canceled_batch_keeps_what_ran_before_the_cancel(backend, provider_server):
    provider_server.batches.auto = False
    batch_id = backend.batch_create(JOB, 1, 0, items(3))
    provider_server.batches.run_first(batch_id, 1)
    backend.batch_cancel(batch_id)
    progress = backend.batch_poll(batch_id)
    assert not progress.ended
    assert progress.status == ("cancelling" if provider_server.BACKEND == "openai" else "canceling")
    provider_server.batches.advance(batch_id)
    assert backend.batch_poll(batch_id).status == ("cancelled" if provider_server.BACKEND == "openai" else "ended")
    got = {item_index(name): outcome for name, (outcome, _) in results(backend, batch_id).items()}
    assert isinstance(got[0], Answer)
    assert got[1].kind == got[2].kind == NOT_RUN and "cancel" in got[2].message


def test_a_batch_created_by_a_worker_that_died_before_recording_it_is_found_not_created_again(
        backend, provider_server):
    provider_server.batches.auto = False
    other_job = "Other_job-xxxxxxxxxxxxxxx"
    old = backend.batch_create(JOB, 1, 0, items(3))  # long before this attempt's intent
    provider_server.batches.batch(old).created_at -= 3600
    since = time.time()
    part = items(3)
    lost = backend.batch_create(JOB, 1, 0, part)  # the worker dies here: the id is never recorded
    backend.batch_create(other_job, 1, 0, items(2, other_job))  # someone else's, another size
    created = provider_server.batches.created

    def create_once() -> list[str]:  # what the job side does before creating
        return backend.batch_find(JOB, 1, 0, since, [name for name, _ in part]) or [
            backend.batch_create(JOB, 1, 0, part)]

    assert create_once() == [lost]
    assert provider_server.batches.created == created
    assert backend.batch_find(JOB, 2, 0, since, [name for name, _ in part]) == (
        [] if provider_server.BACKEND == "openai" else [lost])  # Anthropic: matched by size until read
    assert backend.batch_confirm(lost, [name for name, _ in part]) is (
        True if provider_server.BACKEND == "openai" else None)


def test_anthropic_confirms_a_candidate_by_its_custom_ids_once_it_has_ended(conn, anthropic_server):
    backend = backends.get_backend()
    anthropic_server.batches.auto = False
    since = time.time()
    mine, theirs = items(2), items(2, "Other_job-xxxxxxxxxxxxxxx")
    mine_id = backend.batch_create(JOB, 1, 0, mine)
    theirs_id = backend.batch_create("Other_job-xxxxxxxxxxxxxxx", 1, 0, theirs)
    names = [name for name, _ in mine]
    assert sorted(backend.batch_find(JOB, 1, 0, since, names)) == sorted([mine_id, theirs_id])  # same size
    anthropic_server.batches.complete(mine_id)
    anthropic_server.batches.complete(theirs_id)
    assert backend.batch_find(JOB, 1, 0, since, names) == [mine_id]
    assert backend.batch_confirm(theirs_id, names) is False and backend.batch_confirm(mine_id, names) is True
    with pytest.raises(ValueError, match="custom_ids"):
        backend.batch_find(JOB, 1, 0, since, [])


def test_openai_refuses_a_batch_whose_lines_do_not_match_its_endpoint(conn, model_server):
    backend = backends.get_backend()
    backend._batch_line = lambda item: {"custom_id": item[0], "method": "POST", "url": "/v1/embeddings",
                                        "body": backend._body(item[1])}
    batch_id = backend.batch_create(JOB, 1, 0, items(1))
    progress = backend.batch_poll(batch_id)
    assert progress.ended and progress.status == "failed" and "invalid_url" in progress.message
    assert list(backend.batch_results(batch_id)) == []


def test_batch_usage_is_priced_at_the_batch_discount_and_direct_usage_as_before(env):
    import json

    from jobs.usage.meter import Meter
    from jobs.usage.prices import Price, parse_overrides, price_for

    price = Price(1.0, 2.0, 0.5)
    direct = price.nano_usd(1_000_000, 500_000, 400_000)
    assert direct == round((600_000 * 1.0 + 400_000 * 0.5 + 500_000 * 2.0) * 1000)  # unchanged
    assert price.nano_usd(1_000_000, 500_000, 400_000, batch=True) == direct // 2
    env.setenv("LEASH_MODEL_PRICES", json.dumps({"mine": {"input": 1, "output": 2, "batch": 0.25},
                                                 "plain": {"input": 1, "output": 2}}))
    assert price_for("mine").batch == 0.25 and price_for("plain").batch == 0.5
    assert price_for("mine").nano_usd(1_000_000, 0, batch=True) == 250_000_000
    for bad in ('{"m": {"input": 1, "output": 1, "batch": 2}}', '{"m": {"input": 1, "output": 1, "batch": "half"}}'):
        with pytest.raises(ValueError, match=r'LEASH_MODEL_PRICES\[.m.\]\["batch"\]'):
            parse_overrides(bad)
    assert price_for("gpt-4o-mini", provider_url="").batch == 0.5  # OpenAI's table price
    assert price_for("claude-3-5-haiku-latest", provider_url="https://api.anthropic.com").batch == 0.5
    meter = Meter("prompt")
    meter.record("mine", 1000, 100, price=price_for("mine"))
    meter.record("mine", 1000, 100, price=price_for("mine"), batch=True)
    assert meter.take().nusd == price_for("mine").nano_usd(1000, 100) * 5 // 4


def test_the_batch_list_pages_newest_first_through_the_sdk(backend, provider_server):
    created = [backend.batch_create(JOB, 1, part, items(1)) for part in range(3)]
    if provider_server.BACKEND == "openai":
        listed = [batch.id for batch in backend.client.batches.list(limit=1)]
    else:
        listed = [batch.id for batch in backend.client.messages.batches.list(limit=1)]
    assert listed == created[::-1]


def test_a_failed_look_is_judged_like_a_direct_call_after_the_sdks_own_retries(backend, provider_server):
    provider_server.batches.auto = False
    batch_id = backend.batch_create(JOB, 1, 0, items(2))

    def judged(statuses: list[int]) -> tuple[str, str]:
        provider_server.batches.fail_polls(statuses)
        with pytest.raises(Exception) as raised:
            backend.batch_poll(batch_id)
        return backend.look_failure(raised.value)

    assert judged([500] * 4)[0] == LOOK_AGAIN and provider_server.batches.poll_errors_sent == 4
    assert judged([429] * 4)[0] == LOOK_AGAIN
    kind, message = judged([401])
    assert kind == PERMANENT and "API key" in message
    assert judged([403])[0] == PERMANENT
    assert provider_server.batches.poll_errors_sent == 10  # a refusal is not retried by the SDK
    assert not backend.batch_poll(batch_id).ended  # the errors passed: the batch is there
    backend.batch_cancel(batch_id)
    assert backend.batch_poll(batch_id).canceling
    provider_server.batches.forget(batch_id)
    kind, message = judged([])
    assert kind == BATCH_GONE and "404" in message
    assert backend.look_failure(ValueError("not the provider's")) is None
