"""The call loop's two hooks, in process against a real Redis and the fake HTTP server: what
``_before_call`` is told a call may cost at worst, and the usage ``_after_call`` gets."""

from __future__ import annotations

from types import SimpleNamespace

from jobs.models.openai_backend import OpenAIBackend, _usage
from jobs.models.provider import TOKENS_PER_MESSAGE, TOKENS_PER_PROMPT, CallRequest, Usage, estimated_usage
from tests.fake_openai import Error

TEMPLATE_TOKENS = TOKENS_PER_MESSAGE + TOKENS_PER_PROMPT  # one message


class Recording(OpenAIBackend):
    """The OpenAI backend, noting every hook call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.hooks: list[tuple] = []

    def _before_call(self, request, worst_case_tokens):
        self.hooks.append(("before", worst_case_tokens))
        super()._before_call(request, worst_case_tokens)

    def _after_call(self, request, usage):
        self.hooks.append(("after", usage))
        super()._after_call(request, usage)


def test_each_send_is_told_its_worst_case_before_and_its_usage_after(conn, model_server):
    backend = Recording()
    assert backend.complete("hello", max_tokens=100) == "echo: hello"
    # prompt: 5 bytes + the chat template's 4 a message and 8 a prompt (its bound in every
    # script), + the 100 it may answer with; the fake server bills ASCII at 4 characters a
    # token, and reports no cached ones.
    assert backend.hooks == [("before", 5 + TEMPLATE_TOKENS + 100), ("after", Usage(2, 3, None, estimated=False))]


def test_a_send_that_fails_is_settled_with_no_usage_before_it_is_sent_again(conn, model_server):
    model_server.on("busy", Error(429, "slow down", headers={"retry-after-ms": "10"}))
    backend = Recording()
    assert backend.complete("busy", max_tokens=10) == "echo: busy"
    assert [(hook, value if hook == "before" else value is None) for hook, value in backend.hooks] == [
        ("before", 4 + TEMPLATE_TOKENS + 10), ("after", True), ("before", 4 + TEMPLATE_TOKENS + 10), ("after", False)]


def test_usage_a_server_does_not_report_is_estimated_at_four_ascii_characters_a_token():
    request = CallRequest([{"role": "user", "content": "x" * 41}], max_tokens=8)
    assert request.worst_case_tokens() == 41 + TEMPLATE_TOKENS + 8  # the bound: bytes, not characters / 4
    usage = estimated_usage(request, "y" * 10)
    assert usage.estimated and usage.cached_input_tokens is None
    assert (usage.input_tokens, usage.output_tokens) == (41 // 4 + 1, 10 // 4 + 1)
    silent = SimpleNamespace(usage=None)
    assert _usage(silent, request, "y" * 10) == usage
    reported = SimpleNamespace(usage=SimpleNamespace(
        prompt_tokens=30, completion_tokens=5, total_tokens=35, prompt_tokens_details=SimpleNamespace(cached_tokens=20)))
    assert _usage(reported, request, "y" * 10) == Usage(30, 5, cached_input_tokens=20, estimated=False)
