"""What passes between the call loop (``jobs.models.calls``) and a provider module: the request
the loop asks for, the ``Answer`` and ``Usage`` a provider reads from its SDK's response, the
``Failure`` an SDK exception means, and the functions every provider shares (Retry-After, token
estimates)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from jobs.core import clock

#: Characters per token of ASCII text, for estimates where the server reports no usage.
CHARS_PER_TOKEN = 4
#: Tokens a chat template may add around each message (role markers, separators) and around
#: the whole prompt: part of the bound, since a provider bills them as input. A template may
#: also add a default system prompt when the request has none: SmolLM2's adds 29 tokens (a
#: two-byte prompt is billed 31, tests/test_real_model.py), Qwen's and Llama 3.1's about as many.
TOKENS_PER_MESSAGE = 4
TOKENS_PER_PROMPT = 40


@dataclass(frozen=True)
class CallRequest:
    """One call as the loop asks for it; the provider turns it into its SDK's request."""

    messages: list[dict]  # [{"role": "system" | "user" | "assistant", "content": str}, ...]
    max_tokens: int  # already capped at LEASH_MODEL_MAX_TOKENS
    truncation_ok: bool = False

    #: Set when a budget gave this call fewer output tokens than it asked for (what was left):
    #: an answer cut off at ``max_tokens`` was cut by the budget, not by the model's limit.
    budget_cut: bool = False

    #: The shape the answer must have (``jobs.models.structured.response_format``: the JSON
    #: Schema and its name), or None for free text. Part of the request as sent: each backend
    #: turns it into its own (OpenAI ``response_format``, Anthropic a tool), a digest of the
    #: request includes it, and its bytes count in the input bound (providers bill it as input).
    response_format: dict | None = None

    @property
    def prompt_chars(self) -> int:
        return sum(len(m["content"]) for m in self.messages)

    @property
    def prompt_text(self) -> str:
        return "".join(m["content"] for m in self.messages)

    def input_bound(self) -> int:
        """The most input tokens a provider can bill for this prompt, in every script: a
        byte-level tokenizer (GPT's, Llama 3's, Qwen's; SentencePiece with byte fallback) never
        makes more tokens than the text has UTF-8 bytes, and the chat template adds a few per
        message. Characters / 4 is no bound: Japanese is about a token a character (3 bytes)."""
        shape = len(json.dumps(self.response_format).encode()) + TOKENS_PER_MESSAGE if self.response_format else 0
        return prompt_bytes(self.messages) + TOKENS_PER_MESSAGE * len(self.messages) + TOKENS_PER_PROMPT + shape

    def worst_case_tokens(self) -> int:
        """The most this call can cost: its input bound plus every token it may answer with."""
        return self.input_bound() + self.max_tokens


@dataclass(frozen=True)
class Usage:
    """What one answered call used. ``input_tokens`` is the whole prompt, the cached tokens
    included (a provider that counts them apart, like Anthropic, has them added);
    ``cached_input_tokens`` is None when the server does not say; ``estimated`` is True when it
    reported nothing and the counts are ~4 characters a token; ``batch`` is True when the call
    ran in a provider's batch (priced at its batch discount)."""

    input_tokens: int
    output_tokens: int
    cached_input_tokens: int | None = None
    estimated: bool = False
    batch: bool = False

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


COMPLETE, CUT_OFF = "complete", "cut off"


@dataclass(frozen=True)
class Answer:
    """A provider's reading of a response: the text (None: there was none), whether it is
    COMPLETE or CUT_OFF at max_tokens, the provider's own word for why it stopped, the usage."""

    text: str | None
    finish: str
    stop_reason: str | None
    usage: Usage


RATE_LIMITED, UNAVAILABLE, TIMED_OUT, PERMANENT, RESEND = (
    "rate limited", "unavailable", "timed out", "permanent", "resend")


@dataclass(frozen=True)
class Failure:
    """What an SDK exception means for the call: one of RATE_LIMITED (``wait``: the seconds the
    server asked for, None if it named none), UNAVAILABLE, TIMED_OUT, PERMANENT (``message``
    says what failed and what to fix) or RESEND (the provider changed its request: send again)."""

    kind: str
    message: str = ""
    wait: float | None = None
    overloaded: bool = False  #: a 529: the provider is overloaded for everyone (an outage if it lasts)


def status_failure(status: int, message: str, *, model: str, where: str, too_long: bool, url_hint: str) -> Failure:
    """What an HTTP error answer other than a rate limit means, in the same words for every
    provider, its status always written "(HTTP 400)": ``message`` is the server's, ``where``
    its address, ``too_long`` whether the provider said the prompt does not fit, ``url_hint``
    what its LEASH_MODEL_URL looks like."""
    if status >= 500 or status in (408, 409):
        return Failure(UNAVAILABLE, f"the model server at {where} failed (HTTP {status}): "
                                    f"{message}")
    if too_long:
        return Failure(PERMANENT,
            f"the model server rejected the request (HTTP {status}): {message} -- the prompt is longer than "
            f"the context window of {model}: shorten the items or the template, or use a "
            f"model with a longer context")
    if status == 401:
        return Failure(PERMANENT, f"the model server rejected the API key (HTTP 401): set LEASH_MODEL_API_KEY "
                                  f"({message})")
    if status == 402:
        return Failure(PERMANENT, f"the model provider refused the call for billing (HTTP 402): add credit to the "
                                  f"account of LEASH_MODEL_API_KEY ({message})")
    if status == 403:
        return Failure(PERMANENT,
            f"the model server refused access (HTTP 403): the key in LEASH_MODEL_API_KEY may not use "
            f"model {model!r} ({message})")
    if status == 404:
        return Failure(PERMANENT,
            f"the model server at {where} has no model {model!r} (HTTP 404): set LEASH_MODEL_NAME "
            f"to a model it serves, and LEASH_MODEL_URL to its base URL, {url_hint} ({message})")
    return Failure(PERMANENT, f"the model server rejected the request (HTTP {status}): {message}")


def unreachable(base_url, exc: Exception) -> Failure:
    """A call that never reached the server (refused, reset, DNS): the attempt is retried."""
    return Failure(UNAVAILABLE, f"cannot reach the model server at {base_url}: {exc.__cause__ or exc}")


def prompt_bytes(messages: list[dict]) -> int:
    return sum(len(m["content"].encode("utf-8", "surrogatepass")) for m in messages)


def estimate_tokens(chars: int) -> int:
    """About four characters a token, rounded up (never 0)."""
    return chars // CHARS_PER_TOKEN + 1


def estimate_text_tokens(text: str) -> int:
    """About what a tokenizer makes of ``text``, in any script: ~4 ASCII characters a token, ~1
    token for any other character (a CJK character, an accented letter, an emoji), rounded up
    (never 0). An estimate for a server that reports no usage, not a bound."""
    ascii_chars = sum(1 for c in text if c < "\x80")
    return ascii_chars // CHARS_PER_TOKEN + (len(text) - ascii_chars) + 1


def estimated_usage(request: CallRequest, text: str | None) -> Usage:
    """Usage for a server that reports none, estimated by ``estimate_text_tokens``."""
    input_tokens = estimate_text_tokens(request.prompt_text)
    return Usage(input_tokens=input_tokens, output_tokens=estimate_text_tokens(text or "") if text else 0,
                 estimated=True)


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
