"""What a model call may cost, and what it was paid for: the part of the call loop
(``jobs.models.calls.ModelBackend``) that bounds a call's worst case before it is sent, learns
from what the provider billed, estimates what leash abandons, and keeps answers received.

The input bound holds in every script: a byte-level tokenizer never makes more tokens than the
prompt has UTF-8 bytes (``CallRequest.input_bound``). Once an attempt has seen a few answers to
prompts of the same script it tightens the bound to a margin over the most tokens per byte the
provider billed -- an English prompt then reserves about a third of its bytes -- while a
Japanese prompt in an English job is still held to its bytes.
"""

from __future__ import annotations

import json
import math
import threading
from typing import TYPE_CHECKING

from jobs import keys
from jobs.core.text import decoded
from jobs.errors import PermanentError, Signal
from jobs.models import cache
from jobs.models.cache import request_digest
from jobs.models.provider import Answer, CallRequest, Usage, estimate_text_tokens, prompt_bytes
from jobs.usage import budget

if TYPE_CHECKING:
    from jobs.core.running.context import JobContext
    from jobs.models.model_settings import ModelSettings
    from jobs.usage.prices import Price

#: A call that does not fit its budget while other calls hold room asks again after this
#: long, then half as long again each time, up to ROOM_WAIT_MAX (it renews the lease meanwhile).
ROOM_WAIT_FIRST = 0.2
ROOM_WAIT_MAX = 2.0
#: A call that has waited this long in place gives its worker back: the job is deferred (its
#: attempt not counted, nor the deferral) and waits again when RQ's scheduler brings it back
#: ROOM_DEFER_SECONDS later -- room held by a batch waiting at its provider can take hours, and
#: a worker held meanwhile could be the one that batch's looks need.
ROOM_WAIT_IN_PLACE = 60.0
ROOM_DEFER_SECONDS = 60.0
#: Input bounds tighten after this many answers to prompts of the same script, to this many
#: times the most tokens per byte billed for them (see ModelBackend._input_bound).
TIGHTEN_AFTER = 3
TIGHTEN_MARGIN = 1.5


NO_USAGE = Usage(0, 0)


class WaitForRoom(Signal):
    """The call does not fit a budget now, but calls in flight hold room they may free."""

    def __init__(self, refusal: str = ""):
        super().__init__(refusal)
        self.refusal = refusal


class AskForLess(Signal):
    """Nothing in flight can free room: the call may still ask for ``max_tokens`` output tokens."""

    def __init__(self, max_tokens: int):
        super().__init__(max_tokens)
        self.max_tokens = max_tokens


def script_of(request: CallRequest) -> str:
    """Prompts are bounded apart by script: mostly ASCII text, or any other."""
    text = request.prompt_text
    non_ascii = sum(1 for c in text if c >= "\x80")
    return "ascii" if non_ascii * 10 <= len(text) else "other"


def tightened_bound(request: CallRequest, seen: tuple[float, int] | None, least_billed: int | None = None,
                    shortest: int | None = None) -> int:
    """``request``'s input bound given ``seen``, the most tokens per prompt byte billed for
    prompts of its script and how many answers that is from (None: none seen): the prompt's
    UTF-8 bytes until ``TIGHTEN_AFTER`` answers, then ``TIGHTEN_MARGIN`` times that rate (and
    the chat template's tokens), never above the bytes. Direct calls (``Spending``) and a batch
    job's later parts (jobs/batch/room.py) bound their input with it. ``least_billed`` and
    ``shortest``: the fewest input tokens billed for one prompt of the script and the fewest
    bytes of one, when known. The chat template's tokens are billed within every prompt's, so
    the rate seen (billed / bytes) already counts them for a prompt at least as long as the
    shortest seen (its share of the template is no larger); a shorter prompt gets the fewest
    tokens billed on top (it is template more than text)."""
    strict = request.input_bound()
    if seen is None or seen[1] < TIGHTEN_AFTER:
        return strict
    overhead = strict - prompt_bytes(request.messages)
    if least_billed is not None:
        overhead = 0 if shortest is not None and prompt_bytes(request.messages) >= shortest else min(overhead,
                                                                                                     least_billed)
    return min(strict, math.ceil(prompt_bytes(request.messages) * seen[0] * TIGHTEN_MARGIN) + overhead)


class Spending:
    """Mixed into ModelBackend: ``ctx``, ``settings`` and ``price`` are the backend's."""

    ctx: JobContext | None
    settings: ModelSettings
    price: Price | None
    name: str

    def _init_spending(self, connection) -> None:
        # Answers an earlier attempt received and paid for but could not store (read once).
        self._received: dict[str, dict] = {}
        try:
            self.cache = cache.RequestCache(connection, self.ctx.attempt.owner_name() if self.ctx else "",
                                            self.ctx.payload if self.ctx else {cache.CACHE_FIELD: False})
        except ValueError as exc:  # LEASH_CACHE or LEASH_CACHE_SCOPE is not one of its words: no retry fixes it
            raise PermanentError(str(exc)) from None
        if self.ctx is not None:
            self._received = {str(decoded(k)): json.loads(v)
                              for k, v in connection.hgetall(keys.received_answers(self.ctx.job_id)).items()}
        # What this attempt saw billed: the most tokens per prompt byte (and how many answers)
        # per script, and the output tokens of its answers (sum, count).
        self._learned = threading.Lock()
        self._tokens_per_byte: dict[str, tuple[float, int]] = {}
        self._answers_seen = (0, 0)

    # --- answers received -----------------------------------------------------------------------

    def _digest(self, request: CallRequest) -> str:
        """The request as sent, in one digest (every field the provider sees: ``request_digest``):
        an answer stored under it answers that request only."""
        return request_digest(self.name, self.settings.url or getattr(self, "default_url", ""), self.settings.name,
                              self.settings.temperature, request)

    def _keep_answer(self, digest: str, request: CallRequest, answer: Answer) -> None:
        """Held with the call's usage until its item is stored; kept in Redis for the next
        attempt if that write never lands (Meter.keep). Offered to the request cache only: the
        item's judgement (``_accept``) decides whether it is cached (see jobs.models.cache)."""
        self._offer(digest, request, answer)
        if self.ctx is not None and answer.text is not None:
            self.ctx.meter.answered(self.settings.name, digest, json.dumps(
                {"text": answer.text, "finish": answer.finish, "stop": answer.stop_reason}))

    def _offer(self, digest: str, request: CallRequest, answer: Answer) -> None:
        """This thread's last answer, for ``_accept``; None when it may never be cached."""
        self._held.offer = None
        if self.ctx is not None and self.cache.on and cache.cacheable(answer, request):
            self._held.offer = (self.cache.key(digest), cache.encode(answer))

    def _accept(self) -> None:
        """The item kept this thread's last answer (a label, an object that follows the schema,
        a completion): the item's write caches it. An answer never accepted -- off-label,
        invalid after its repairs, cut off -- is paid for and counted, never cached."""
        offer = getattr(self._held, "offer", None)
        self._held.offer = None
        if offer is not None and self.ctx is not None:
            self.ctx.meter.to_cache(self.settings.name, *offer)

    def _from_cache(self, digest: str) -> Answer | None:
        """The request's answer from the request cache (counted as a hit, at no cost), or None.
        Only kept answers are there, so a hit is one its item keeps."""
        self._held.offer = None
        if self.ctx is None or not self.cache.on:
            return None
        answer = self.cache.get(digest)
        if answer is not None:
            self.ctx.meter.cache_hit(self.settings.name, self.cache.key(digest))
        return answer

    def record_usage(self, usage: Usage) -> None:
        """Count an answered call's usage on this thread's item, priced (at the batch discount
        when ``usage.batch``: a batch's results are counted with this alone, as batches do not
        spend the direct calls' RPM / TPM limits)."""
        if self.ctx is not None:
            self.ctx.meter.record(self.settings.name, usage.input_tokens, usage.output_tokens,
                                  usage.cached_input_tokens or 0, usage.estimated, self.price, batch=usage.batch)

    # --- what a call may cost -----------------------------------------------------------------

    def _worst_case(self, request: CallRequest) -> int:
        """The call's worst case: its input bound (tightened by the answers this attempt has
        seen, see ``_input_bound``) plus every token it may answer with."""
        return self._input_bound(request) + request.max_tokens

    def _input_bound(self, request: CallRequest) -> int:
        """At most the prompt's UTF-8 bytes (``CallRequest.input_bound``, which holds for every
        script). Once this attempt has seen ``TIGHTEN_AFTER`` answers to prompts of the same
        script (mostly ASCII, or not), tightened to ``TIGHTEN_MARGIN`` times the most tokens per
        byte the provider billed for them: English prompts then reserve ~a third of their
        bytes, not all of them, while a Japanese prompt in an English job is still held to its
        bytes."""
        return tightened_bound(request, self._tokens_per_byte.get(script_of(request)))

    def _learn(self, request: CallRequest, usage: Usage) -> None:
        """Remember what the provider billed for this prompt (tokens per byte, by script) and
        for its answer (the average, for estimates of abandoned calls)."""
        if usage.estimated or usage.batch:
            return
        size = max(1, prompt_bytes(request.messages))
        with self._learned:
            script = script_of(request)
            most, count = self._tokens_per_byte.get(script, (0.0, 0))
            self._tokens_per_byte[script] = (max(most, usage.input_tokens / size), count + 1)
            self._answers_seen = (self._answers_seen[0] + usage.output_tokens, self._answers_seen[1] + 1)

    def _estimated_input(self, request: CallRequest) -> int:
        """The input tokens a call probably costs: from what this attempt saw billed, else
        ``estimate_text_tokens``; never above the bound."""
        seen = self._tokens_per_byte.get(script_of(request))
        if seen is not None and seen[1]:
            guess = math.ceil(prompt_bytes(request.messages) * seen[0])
        else:
            guess = estimate_text_tokens(request.prompt_text)
        return min(request.input_bound(), guess)

    def _abandoned_usage(self, request: CallRequest) -> Usage:
        """A call leash gave up on (timed out) was probably paid for: its input, and an answer
        as long as this attempt's average (the whole max_tokens when it has seen none)."""
        total, count = self._answers_seen
        output = min(request.max_tokens, math.ceil(total / count)) if count else request.max_tokens
        return Usage(input_tokens=self._estimated_input(request), output_tokens=output, estimated=True)

    def _call_estimate(self, request: CallRequest) -> budget.CallEstimate:
        input_tokens = self._estimated_input(request)
        input_nusd = self.price.nano_usd(input_tokens, 0) if self.price is not None else 0
        return budget.CallEstimate(self.settings.name, input_tokens, input_nusd, request.max_tokens)

    def _output_that_fits(self, request: CallRequest, admission: budget.Admission, input_bound: int) -> int | None:
        """When nothing in flight can free room: the most output tokens the budget still has room
        for (at least MIN_OUTPUT_TOKENS, or the call's own max_tokens when that is fewer),
        else None (the job stops)."""
        if admission.what.endswith("_unpriced") or admission.room <= 0:
            return None
        if admission.what.endswith("tokens"):
            fits = admission.room - input_bound
        else:
            if self.price is None:
                return None
            low, high = 0, request.max_tokens  # the most output whose worst cost fits the room
            while low < high:
                middle = (low + high + 1) // 2
                if self.price.nano_usd(input_bound, middle) <= admission.room:
                    low = middle
                else:
                    high = middle - 1
            fits = low if self.price.nano_usd(input_bound, low) <= admission.room else 0
        fits = min(fits, request.max_tokens - 1)
        return fits if fits >= min(budget.MIN_OUTPUT_TOKENS, request.max_tokens) else None

