"""Where a job kind's model calls go. A backend is a small object with ``classify`` and
``complete``; the offline one below needs no network and is deterministic, so the product
works out of the box.

Which backend runs is configuration: ``LEASH_MODEL_BACKEND`` names one (``local``,
``openai``, ``anthropic``); unset, it is ``openai`` when ``LEASH_MODEL_URL`` is set and ``local`` otherwise.
A backend is built per attempt with the job's context, so it can keep the lease alive while
it waits for a rate limit or a slow call.

A backend that calls a model server is one module, ``jobs/models/<name>_backend.py``: a subclass
of ``jobs.models.calls.ModelBackend`` that supplies how its SDK sends one request, what its
exceptions mean and how an answer reads, and ends with ``backends.register(...)``; it is named
below in ``_BUILT_IN`` so the worker finds it (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import hashlib
import importlib
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from jobs import config
from jobs.config import settings
from jobs.errors import PermanentError
from jobs.models import structured
from jobs.usage.prices import parse_overrides

if TYPE_CHECKING:
    from jobs.core.running.context import JobContext


class Backend(Protocol):
    name: str
    supports_batch: bool  # True: it also has the batch methods of jobs.models.batch_api.batching

    def classify(self, text: str, labels: list[str]) -> str:
        """Return exactly one of ``labels`` for ``text`` (or raise ItemError)."""

    def extract(self, messages: list[dict], schema: dict, answer: str | None = None, check=None):
        """Return the object the model answers ``messages`` with, following ``schema`` (or raise
        ItemError): jobs.models.structured."""

    def complete(self, prompt: str, max_tokens: int | None = None, truncation_ok: bool = False) -> str:
        """Return the model's answer to ``prompt``, in at most ``max_tokens`` (never more than
        LEASH_MODEL_MAX_TOKENS); an answer cut off there raises ItemError unless ``truncation_ok``."""

    def reduce(self, instruction: str, texts: list[str], partial: bool = False) -> str:
        """One answer to ``instruction`` over ``texts`` (jobs.models.prompts.reduce_messages): a
        ``reduce`` job's partial of one chunk, or its answer."""


# Words that hint at common labels, compared by their stems ("crashes" is "crash"); anything
# else falls back to word overlap with the label, then to a neutral label if there is one, then
# to a hash. A negation just before a sentiment word ("not good") turns it around.
_LEXICON = {
    "positive": {"good", "great", "love", "excellent", "happy", "nice", "awesome", "thanks", "thank", "fast",
                 "perfect", "amazing", "helpful", "recommend", "best", "like", "enjoy", "works", "worked", "fixed",
                 "smooth", "easy", "wonderful", "pleased", "glad", "friendly", "quick", "brilliant", "fantastic"},
    "negative": {"bad", "terrible", "hate", "awful", "broken", "slow", "angry", "worst", "refund", "poor",
                 "crash", "freeze", "fail", "failure", "error", "bug", "wrong", "problem", "issue", "useless",
                 "disappointed", "disappointing", "annoying", "missing", "late", "lost", "charged", "overcharged",
                 "expensive", "rude", "never", "unusable", "horrible", "complaint", "cancel", "return", "returned",
                 "stuck", "damaged", "scam", "waste", "confusing", "hang", "laggy", "unhappy"},
    "spam": {"free", "winner", "prize", "click", "offer", "viagra", "lottery", "urgent", "congratulations",
             "unsubscribe", "bitcoin", "crypto"},
    "bug": {"error", "crash", "broken", "fails", "fail", "exception", "bug", "wrong", "freeze", "hang",
            "stuck", "glitch"},
    "question": {"how", "why", "what", "when", "where", "which", "can", "?"},
}
_NEUTRAL = ("neutral", "other", "none", "unknown", "mixed")
_NEGATIONS = {"not", "no", "never", "isn't", "wasn't", "don't", "doesn't", "didn't", "can't", "won't", "hardly"}
_FLIP = {"positive": "negative", "negative": "positive"}
_WORD = re.compile(r"[a-z0-9']+|\?")
LOCAL_ANSWER_CHARS = 200


def _stem(word: str) -> str:
    """A crude stem, enough to match a lexicon: "crashes", "crashed", "crashing" are "crash"."""
    for suffix in ("ing", "ed", "es", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            word = word[: -len(suffix)]
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


_STEMMED = {label: {_stem(w) for w in words} for label, words in _LEXICON.items()}


def _scores(text: str, labels: list[str]) -> dict[str, int]:
    """Each label's count of hint words in ``text`` (sentiment words after a negation count for
    the opposite sentiment)."""
    words = _WORD.findall(text.lower())
    stems = [_stem(w) for w in words]
    scores = dict.fromkeys(labels, 0)
    by_name = {label.lower(): label for label in labels}
    for n, stem in enumerate(stems):
        negated = any(w in _NEGATIONS for w in words[max(0, n - 2):n])
        for label in labels:
            name = label.lower()
            hints = _STEMMED.get(name, set()) | {_stem(w) for w in _WORD.findall(name)}
            if stem in hints:
                target = by_name.get(_FLIP[name]) if negated and name in _FLIP else label
                if target is not None:
                    scores[target] += 1
    return scores


class LocalBackend:
    """Deterministic offline classifier: a small lexicon (stems, negation) and word overlap;
    a neutral label when nothing hints, else a hash."""

    name = "local"
    supports_batch = False

    def __init__(self, ctx: JobContext | None = None, delay_ms: int | None = None):
        self.delay_s = (settings().local_delay_ms if delay_ms is None else delay_ms) / 1000.0

    def classify(self, text: str, labels: list[str]) -> str:
        if self.delay_s:
            time.sleep(self.delay_s)  # stands in for a model call's latency in demos
        scores = _scores(text, labels)
        best = max(labels, key=lambda label: scores[label])  # the first of equals
        if scores[best] > 0:
            return best
        neutral = next((label for label in labels if label.lower() in _NEUTRAL), None)
        if neutral is not None:
            return neutral
        digest = hashlib.sha256(text.encode()).digest()
        return labels[digest[0] % len(labels)]

    def extract(self, messages: list[dict], schema: dict, answer: str | None = None, check=None):
        """An offline stand-in for a structured answer: an object that follows ``schema``, from
        the words of the last message."""
        if self.delay_s:
            time.sleep(self.delay_s)
        return structured.example(schema, messages[-1]["content"] if messages else "")

    def complete(self, prompt: str, max_tokens: int | None = None, truncation_ok: bool = False) -> str:
        """An offline stand-in for a completion: the prompt's words, reversed and counted."""
        if self.delay_s:
            time.sleep(self.delay_s)
        words = prompt.split()
        # Bounded like a model's answer (max_tokens), however long the prompt's words are.
        return (f"[local] {len(words)} words: " + " ".join(reversed(words[-12:])))[:LOCAL_ANSWER_CHARS]

    def reduce(self, instruction: str, texts: list[str], partial: bool = False) -> str:
        """An offline stand-in for a reduce call: how many inputs the texts stand for and their
        most frequent words, counted. A partial of this backend is read back as the inputs and
        word counts it summed, so every chunk tree of the same inputs answers the same."""
        if self.delay_s:
            time.sleep(self.delay_s)
        inputs, words = 0, Counter()
        for text in texts:
            summed = _LOCAL_REDUCED.match(text)
            if summed:
                inputs += int(summed["inputs"])
                words.update({w: int(n) for w, n in _LOCAL_COUNTED.findall(summed["words"])})
            else:
                inputs += 1
                words.update(w for w in _WORD.findall(text.lower()) if len(w) > 3 and w not in _COMMON)
        # A partial keeps more words than the answer shows, so the answer counts them across chunks.
        top = sorted(words.items(), key=lambda pair: (-pair[1], pair[0]))[:LOCAL_REDUCE_WORDS * (4 if partial else 1)]
        counted = ", ".join(f"{word} ({n})" for word, n in top) or "none"
        head = f"[local] {inputs} inputs; frequent words: {counted}"
        return head if partial else f"{head} (for: {instruction[:80]})"


#: The words the local reduce counts the most of, and the words it never counts.
LOCAL_REDUCE_WORDS = 8
_COMMON = {"this", "that", "with", "have", "from", "they", "were", "what", "when", "your", "will", "would", "there",
           "their", "been", "than", "then", "them", "very", "just", "about", "also", "into", "only", "after"}
_LOCAL_REDUCED = re.compile(r"^\[local\] (?P<inputs>\d+) inputs; frequent words: (?P<words>[^\n]*?)(?: \(for: .*)?$")
_LOCAL_COUNTED = re.compile(r"([a-z0-9']+) \((\d+)\)")


_BACKENDS = {"local": LocalBackend}
_WARM: dict[str, Callable[[], None]] = {}
# Built-in backends whose module registers them when first asked for (keeps imports light):
# a new backend is one line here.
_BUILT_IN = {"openai": "jobs.models.openai_backend", "anthropic": "jobs.models.anthropic_backend"}


def register(name: str, factory, warm: Callable[[], None] | None = None) -> None:
    """``factory(ctx)`` builds the backend for one attempt (``ctx`` may be None outside a job);
    ``warm()``, if given, runs once in the worker before it forks (see ``preload``)."""
    _BACKENDS[name] = factory
    if warm is not None:
        _WARM[name] = warm


def backend_name() -> str:
    calls = config.model_calls()
    name = (calls.model_backend or "").strip()
    if name:
        return name
    return "openai" if (calls.model_url or "").strip() else "local"


def _factory(name: str):
    if name not in _BACKENDS and name in _BUILT_IN:
        importlib.import_module(_BUILT_IN[name])
    try:
        return _BACKENDS[name]
    except KeyError:
        known = sorted(set(_BACKENDS) | set(_BUILT_IN))
        raise PermanentError(f"LEASH_MODEL_BACKEND={name!r} is unknown; choose one of {known}") from None


def batch_problem() -> str | None:
    """Why the configured backend cannot run batch jobs (no batch API, or unknown), or None.
    Asks its class: nothing is built or connected, so the door can ask on every submission."""
    name = backend_name()
    try:
        factory = _factory(name)
    except PermanentError as exc:
        return str(exc)
    if not getattr(factory, "supports_batch", False):
        return f"the configured model backend ({name}, LEASH_MODEL_BACKEND) has no batch API"
    return None


def structured_problem(schema: dict) -> str | None:
    """What the configured backend's structured output refuses in ``schema`` (OpenAI's strict
    mode: additionalProperties false, every property required), or None. Asks its class."""
    try:
        factory = _factory(backend_name())
    except PermanentError as exc:
        return str(exc)
    check = getattr(factory, "structured_problem", None)
    try:
        return check(schema) if check is not None else None
    except PermanentError as exc:  # LEASH_MODEL_STRUCTURED_OUTPUT names no mode
        return str(exc)


def backend_class():
    """The configured backend's class (or factory), without building it: PermanentError when
    LEASH_MODEL_BACKEND names none."""
    return _factory(backend_name())


def get_backend(ctx: JobContext | None = None) -> Backend:
    return _factory(backend_name())(ctx)


def preload() -> str | None:
    """Import the configured backend's module now, in the worker before it forks: every
    work-horse then inherits it instead of importing it again for each job (the OpenAI SDK
    takes about 0.4 s, most of a short job), and warm what the backend imports lazily.
    Returns what is wrong with the configuration (its jobs will fail with that text), or None."""
    name = backend_name()
    try:
        _factory(name)
    except PermanentError as exc:
        return str(exc)
    try:
        parse_overrides(config.model_calls().model_prices)
    except ValueError as exc:
        return str(exc)
    if name in _WARM:
        _WARM[name]()
    return None
