"""The OpenAI and Anthropic backends map the same answers onto the same outcomes: one set of
cases, run against each backend and its fake server over real loopback HTTP (a direct call
through ``_send``, the SDK's exception through ``_failure``, the answer through ``_read``).
The job-level behaviour of each outcome is tested with workers in test_backend_openai.py and
test_backend_units.py, also against both."""

from __future__ import annotations

import pytest

from jobs.models import backends
from jobs.models.provider import COMPLETE, CUT_OFF, PERMANENT, RATE_LIMITED, UNAVAILABLE, CallRequest
from tests.fake_openai import Error, Reply


def send(backend, item: str):
    """One direct call: ("answer", Answer) or ("failure", Failure)."""
    request = CallRequest([{"role": "user", "content": item}], 20)
    try:
        response = backend._send(request)
    except Exception as exc:  # noqa: BLE001 (the SDK's exception is what is being mapped)
        failure = backend._failure(exc)
        assert failure is not None, f"{exc!r} is not the SDK's"
        return "failure", failure
    return "answer", backend._read(response, request)


@pytest.mark.parametrize("status, headers, kind, wait", [
    (429, {"retry-after": "3"}, RATE_LIMITED, 3.0),
    (429, {"retry-after-ms": "250"}, RATE_LIMITED, 0.25),
    (429, {}, RATE_LIMITED, None),
    (500, {}, UNAVAILABLE, None),
    (502, {}, UNAVAILABLE, None),
    (503, {"retry-after": "1"}, UNAVAILABLE, None),
    (408, {}, UNAVAILABLE, None),
    (400, {}, PERMANENT, None),
    (401, {}, PERMANENT, None),
    (403, {}, PERMANENT, None),
    (404, {}, PERMANENT, None),
    (422, {}, PERMANENT, None),
])
def test_an_error_status_means_the_same_for_both_backends(conn, provider_server, status, headers, kind, wait):
    provider_server.on("x", Error(status, "the server says no", headers=headers))
    outcome, failure = send(backends.get_backend(), "x")
    assert outcome == "failure" and failure.kind == kind
    assert failure.wait == wait
    if kind != RATE_LIMITED:
        assert "the server says no" in failure.message and str(status) in failure.message


def test_529_overloaded_is_a_rate_limit_with_its_retry_after_for_anthropic(conn, anthropic_server):
    anthropic_server.on("x", Error(529, "Overloaded", headers={"retry-after": "2"}))
    outcome, failure = send(backends.get_backend(), "x")
    assert (outcome, failure.kind, failure.wait) == ("failure", RATE_LIMITED, 2.0)


def test_an_answer_cut_off_at_max_tokens_reads_as_cut_off_for_both_backends(conn, provider_server):
    provider_server.on("long", Reply("a b c", finish_reason=provider_server.cut_off))
    assert send(backends.get_backend(), "long")[1].finish == CUT_OFF
    assert send(backends.get_backend(), "short")[1].finish == COMPLETE
