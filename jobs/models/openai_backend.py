"""The OpenAI-compatible backend: OpenAI itself, or any server speaking its chat completions
API (vLLM, Ollama, llama.cpp's server, LM Studio...), through the official ``openai`` SDK.

The SDK's own retries are off: the queue owns retries, because only the queue knows which
items are checkpointed and how many attempts a job has left. How a call's failure maps onto
the job's state machine:

    429 + Retry-After <= LEASH_MODEL_MAX_INLINE_WAIT  -> wait in place (lease renewed), call again
    429 + a longer Retry-After                        -> RetryLater: rescheduled, no attempt counted
    5xx, 408, 409, timeout, connection refused        -> ModelUnavailable: the attempt fails and
                                                         the job is retried with backoff
    400 (context length...), 401, 403, 404, 4xx       -> PermanentError saying what to fix
    classify: an answer outside the labels, twice     -> ItemError: stored for that item only
    prompt: finish_reason "length" (cut off)          -> ItemError naming LEASH_MODEL_MAX_TOKENS

Every call takes a slot of the model's adaptive concurrency limit (jobs.models.concurrency: a
429 or a timeout halves it for every job), waits its turn on the shared rate limit
(jobs.models.rate), asks for at most ``LEASH_MODEL_MAX_TOKENS`` tokens and runs inside
``ctx.keepalive`` so a slow answer does not cost the job its lease.
"""

from __future__ import annotations

import re
import time
from contextlib import nullcontext
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import openai

from . import backends
from .. import clock
from ..config import get, settings
from ..connection import connect
from ..context import JobContext
from ..errors import ItemError, PermanentError, RetryLater
from .concurrency import OK, RATE_LIMITED, TIMED_OUT, ConcurrencyGate, SharedLimit
from .rate import PAUSED, TOKENS_SPENT, ModelRateLimit

#: 429s answered in place, per call, before the job is rescheduled instead.
MAX_INLINE_429 = 5
#: Wait after a 429 that names no delay.
DEFAULT_RETRY_AFTER = 5.0
#: The most tokens ``classify`` asks for: a label is a few words.
CLASSIFY_MAX_TOKENS = 32


class ModelUnavailable(Exception):
    """The model server failed or could not be reached; the attempt is retried."""


@dataclass(frozen=True)
class ModelSettings:
    url: str | None
    name: str
    api_key: str
    timeout: float
    max_inline_wait: float
    rpm: float
    tpm: float
    temperature: float | None
    max_tokens: int = 1024

    @classmethod
    def from_env(cls) -> ModelSettings:
        name = (get("LEASH_MODEL_NAME") or "").strip()
        if not name:
            raise PermanentError("LEASH_MODEL_NAME is not set: name the model to call (e.g. gpt-4o-mini, llama3.1)")
        try:
            return cls(
                url=(get("LEASH_MODEL_URL") or "").strip() or None,
                name=name,
                # Local servers ignore the key, but the SDK insists on one.
                api_key=(get("LEASH_MODEL_API_KEY") or "").strip() or "no-key",
                timeout=get("LEASH_MODEL_TIMEOUT"),
                max_inline_wait=get("LEASH_MODEL_MAX_INLINE_WAIT"),
                rpm=get("LEASH_MODEL_RPM"),
                tpm=get("LEASH_MODEL_TPM"),
                temperature=get("LEASH_MODEL_TEMPERATURE"),
                max_tokens=get("LEASH_MODEL_MAX_TOKENS"),
            )
        except ValueError as exc:  # a setting no retry can fix
            raise PermanentError(str(exc)) from None


def retry_after_seconds(headers, now: float | None = None) -> float | None:
    """The wait a 429 asks for: ``retry-after-ms``, or ``Retry-After`` in seconds or as an
    HTTP date. None when there is no usable header."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = (headers.get("retry-after") or "").strip()
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (clock.wall() if now is None else now))


def _server_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    if isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return exc.message


def _looks_like_context_length(exc: openai.APIStatusError, message: str) -> bool:
    text = message.lower()
    return exc.code == "context_length_exceeded" or (
        "context" in text and any(w in text for w in ("length", "window", "token", "too long")))


def status_error(exc: openai.APIStatusError, settings: ModelSettings) -> Exception:
    """The leash exception for an HTTP error answer (429 is handled by the caller)."""
    status, message = exc.status_code, _server_message(exc)
    where = settings.url or "api.openai.com"
    if status >= 500 or status in (408, 409):
        return ModelUnavailable(f"the model server at {where} failed ({status}): {message}")
    if status == 400 and _looks_like_context_length(exc, message):
        return PermanentError(
            f"the model server rejected the request (400): {message} -- the prompt is longer than "
            f"the context window of {settings.name}: shorten the items or the template, or use a "
            f"model with a longer context")
    if status == 401:
        return PermanentError(f"the model server rejected the API key (401): set LEASH_MODEL_API_KEY ({message})")
    if status == 403:
        return PermanentError(
            f"the model server refused access (403): the key in LEASH_MODEL_API_KEY may not use "
            f"model {settings.name!r} ({message})")
    if status == 404:
        return PermanentError(
            f"the model server at {where} has no model {settings.name!r} (404): set LEASH_MODEL_NAME "
            f"to a model it serves, and LEASH_MODEL_URL to its base URL, usually ending in /v1 ({message})")
    return PermanentError(f"the model server rejected the request ({status}): {message}")


_THINKING = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


def match_label(answer: str, labels: list[str]) -> str | None:
    """The label an answer names, tolerating case, quotes, a list marker ("- no"), a trailing
    period and a reasoning model's <think> block, or a label that opens a sentence ("No, ice is
    not hot."); None if it names none, or opens with more than one label."""
    cleaned = _THINKING.sub("", answer or "").strip(" \t\r\n\"'`*.")
    cleaned = _LIST_MARKER.sub("", cleaned).strip(" \t\r\n\"'`*.")
    if cleaned in labels:
        return cleaned
    by_lower = {label.lower(): label for label in labels}
    if cleaned.lower() in by_lower:
        return by_lower[cleaned.lower()]
    opening = [label for label in labels
               if re.match(re.escape(label.lower()) + r"[,.;:!\n]", cleaned.lower())]
    return opening[0] if len(opening) == 1 else None


_LIST_MARKER = re.compile(r"^(?:[-*\u2022]|\d+[.)])\s+")


class OpenAIBackend:
    name = "openai"

    def __init__(self, ctx: JobContext | None = None, settings: ModelSettings | None = None):
        self.ctx = ctx
        self.settings = settings or ModelSettings.from_env()
        s = self.settings
        self.connect_timeout = min(s.timeout, 10.0)
        self.client = openai.OpenAI(
            base_url=s.url, api_key=s.api_key, max_retries=0,
            timeout=openai.Timeout(s.timeout, connect=self.connect_timeout),
        )
        connection = ctx.connection if ctx else connect()
        self.limit = ModelRateLimit(connection, s.name, rpm=s.rpm, tpm=s.tpm)
        self.gate = ConcurrencyGate(SharedLimit(connection, s.name, _item_concurrency()), ctx.job_id if ctx else "")
        # OpenAI's reasoning models refuse max_tokens and want max_completion_tokens; the first
        # such refusal switches this backend over.
        self.token_limit_field = "max_tokens"

    # --- the two operations ------------------------------------------------------------

    def classify(self, text: str, labels: list[str]) -> str:
        listing = "\n".join(f"- {label}" for label in labels)
        messages = [
            {"role": "system", "content": "Classify the user's text. Reply with exactly one label from "
                                          f"this list, written as it appears, and nothing else:\n{listing}"},
            {"role": "user", "content": text},
        ]
        # A label is a few tokens; a cut-off answer is judged like any other (it names a label
        # or it gets the correction), so truncation is fine here.
        budget = min(CLASSIFY_MAX_TOKENS, self.settings.max_tokens)
        first = self._chat(messages, max_tokens=budget, truncation_ok=True)
        label = match_label(first, labels)
        if label is not None:
            return label
        messages += [
            {"role": "assistant", "content": first},
            {"role": "user", "content": f"{first.strip()[:200]!r} is not one of the labels. "
                                        f"Reply with exactly one of: {', '.join(labels)}"},
        ]
        second = self._chat(messages, max_tokens=budget, truncation_ok=True)
        label = match_label(second, labels)
        if label is None:
            raise ItemError(f"the model answered {first.strip()[:100]!r}, then {second.strip()[:100]!r}: "
                            f"neither is one of the labels {labels}")
        return label

    def complete(self, prompt: str, max_tokens: int | None = None, truncation_ok: bool = False) -> str:
        """The model's answer; one cut off at ``max_tokens`` (at most LEASH_MODEL_MAX_TOKENS)
        is an ItemError unless ``truncation_ok``."""
        return self._chat([{"role": "user", "content": prompt}], max_tokens=max_tokens, truncation_ok=truncation_ok)

    # --- one call, with the limits, the lease and the error mapping -----------------------

    def _chat(self, messages: list[dict], max_tokens: int | None = None, truncation_ok: bool = False) -> str:
        budget = self.settings.max_tokens if max_tokens is None else min(max_tokens, self.settings.max_tokens)
        wait = DEFAULT_RETRY_AFTER
        for _ in range(MAX_INLINE_429 + 1):
            epoch = self.gate.acquire(self.ctx.stopping() if self.ctx else None)
            outcome = None
            try:
                self._wait_turn()
                with self._keepalive():
                    response = self.client.chat.completions.create(
                        model=self.settings.name, messages=messages, **self._options(budget))
                outcome = OK
            except openai.RateLimitError as exc:
                if exc.code == "insufficient_quota":
                    raise PermanentError(f"the model provider says the account is out of quota (429): "
                                         f"{_server_message(exc)}") from exc
                outcome = RATE_LIMITED
                wait = retry_after_seconds(exc.response.headers)
                wait = DEFAULT_RETRY_AFTER if wait is None else wait
                self.limit.pause(wait)  # every worker calling this model waits too
                continue
            except openai.BadRequestError as exc:
                if self._switch_token_limit_field(exc):
                    continue
                raise status_error(exc, self.settings) from exc
            except openai.APIStatusError as exc:
                raise status_error(exc, self.settings) from exc
            except openai.APITimeoutError as exc:
                outcome = TIMED_OUT
                raise ModelUnavailable(f"the model call timed out after {self.settings.timeout:g}s "
                                       f"(LEASH_MODEL_TIMEOUT)") from exc
            except openai.APIConnectionError as exc:
                raise ModelUnavailable(f"cannot reach the model server at {self.client.base_url}: "
                                       f"{exc.__cause__ or exc}") from exc
            finally:
                self.gate.release(epoch, outcome)
            return self._answer(response, messages, budget, truncation_ok)
        raise RetryLater(wait, f"the model server kept answering 429 (last Retry-After {wait:g}s)")

    def _answer(self, response, messages: list[dict], budget: int, truncation_ok: bool) -> str:
        usage = getattr(response, "usage", None)
        choice = response.choices[0] if response.choices else None
        content = choice.message.content if choice is not None else None
        tokens = getattr(usage, "total_tokens", None)
        if not tokens:  # servers that report no usage: about four characters a token
            tokens = (sum(len(m["content"]) for m in messages) + len(content or "")) // 4 + 1
        self.limit.spend(tokens)
        if choice is not None and choice.finish_reason == "length" and not truncation_ok:
            raise ItemError(f"answer cut off at max_tokens={budget}; raise LEASH_MODEL_MAX_TOKENS")
        if content is None:
            reason = choice.finish_reason if choice is not None else "no choices"
            raise ItemError(f"the model returned no text (finish_reason={reason})")
        return content

    def _options(self, budget: int) -> dict:
        options: dict = {self.token_limit_field: budget}
        if self.settings.temperature is not None:
            options["temperature"] = self.settings.temperature
        return options

    def _switch_token_limit_field(self, exc: openai.BadRequestError) -> bool:
        """True (and switched) when the server asked for max_completion_tokens instead."""
        if self.token_limit_field == "max_tokens" and "max_completion_tokens" in _server_message(exc):
            self.token_limit_field = "max_completion_tokens"
            return True
        return False

    def _keepalive(self):
        if self.ctx is None:
            return nullcontext()
        # The longest a call can legitimately take: connecting, then waiting for the answer.
        return self.ctx.keepalive(self.settings.timeout + self.connect_timeout + 1)

    def _sleep(self, seconds: float) -> None:
        if self.ctx is None:
            time.sleep(seconds)
        else:
            self.ctx.sleep(seconds)

    def _wait_turn(self) -> None:
        """Wait for this call's slot on the shared rate limit, renewing the lease meanwhile."""
        while True:
            turn = self.limit.acquire(max_pause=self.settings.max_inline_wait)
            if turn.code == PAUSED:
                raise RetryLater(turn.wait_seconds, f"the model server asked to wait {turn.wait_seconds:g}s (429)")
            if turn.wait_seconds > 0:
                self._sleep(turn.wait_seconds)
            if turn.code != TOKENS_SPENT:
                return


def _item_concurrency() -> int:
    try:
        return settings().item_concurrency
    except ValueError as exc:  # a setting no retry can fix
        raise PermanentError(str(exc)) from None


def _warm() -> None:
    """The SDK imports a client's parts on first use (about 60 ms): use them once, so a
    work-horse forked afterwards starts with them loaded. Sends nothing."""
    with openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0) as client:
        client.chat.completions  # noqa: B018 (the first access is what imports them)


backends.register("openai", OpenAIBackend, warm=_warm)
