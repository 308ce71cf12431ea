"""One call loop for every model backend: the limits, the lease and the error mapping live here,
once. A provider module (``openai_backend``) subclasses ``ModelBackend`` and supplies only what
its SDK does differently: ``_send`` (build and send one request), ``_failure`` (what an SDK
exception means) and ``_read`` (text, complete or cut off, usage), in the terms of
``jobs.models.provider``.

Each call goes through these steps (``ModelBackend._call``)::

    gate       take a slot of the model's adaptive concurrency limit (jobs.models.concurrency)
    before     _before_call(request, worst_case_tokens): wait for the shared rate turn
               (jobs.models.rate), renewing the lease meanwhile
    send       the provider's _send(request), inside ctx.keepalive so a slow answer keeps the lease
    after      _after_call(request, usage): the call's usage (the provider's _read(response)),
               counted at once, still inside the keepalive (a cancel it learned cannot lose it)
    classify   the outcome: ok, or the provider's _failure(exc) for an SDK exception:
               RATE_LIMITED (wait), UNAVAILABLE, TIMED_OUT, PERMANENT or RESEND (changed request)
    release    give the slot back, reporting ok / 429 / timeout to the shared limit (best effort)
    answer     the text; an answer cut off at max_tokens is an ItemError unless truncation_ok

How an outcome maps onto the job's state machine (the SDK's own retries are off: the queue owns
retries, because only the queue knows which items are checkpointed):

    RATE_LIMITED, wait <= LEASH_MODEL_MAX_INLINE_WAIT -> every caller of the model pauses, this
                                                         call waits in place (lease renewed), again
    RATE_LIMITED, a longer wait or 5 in a row         -> RetryLater: rescheduled, no attempt counted
    UNAVAILABLE (sent again in place), TIMED_OUT      -> ModelUnavailable: the attempt fails and the job
                                                         is retried; every call failing: outage.py
    PERMANENT                                         -> PermanentError saying what to fix
    RESEND                                            -> the provider changed its request (e.g. the
                                                         token-limit field), sent again at once

The two hooks, the only places the loop looks at the cost of a call, ``_before_call(request,
worst_case_tokens)`` and ``_after_call(request, usage)``: docs/ARCHITECTURE.md ("the two hooks").
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import redis

from jobs.config import model_calls, settings
from jobs.core.store.connection import connect
from jobs.errors import ItemError, LeaseLost, LeashError, PermanentError, RetryLater
from jobs.models import spending
from jobs.models.concurrency import OK, ConcurrencyGate, SharedLimit
from jobs.models.concurrency import RATE_LIMITED as GATE_RATE_LIMITED
from jobs.models.concurrency import TIMED_OUT as GATE_TIMED_OUT
from jobs.models.model_settings import ModelSettings

# match_label: the provider modules import it from here.
from jobs.models.outage import OutageWatch, overloaded_out
from jobs.models.prompts import CLASSIFY_MAX_TOKENS, classify_messages, match_label, reduce_messages  # noqa: F401
from jobs.models.provider import (
    CUT_OFF,
    RATE_LIMITED,
    RESEND,
    TIMED_OUT,
    UNAVAILABLE,
    Answer,
    CallRequest,
    Failure,
    Usage,
)
from jobs.models.rate import PAUSED, TOKENS_SPENT, ModelRateLimit
from jobs.models.spending import AskForLess, Spending, WaitForRoom
from jobs.models.structured import Extracting
from jobs.usage import budget, prices

if TYPE_CHECKING:
    from jobs.core.running.context import JobContext

log = logging.getLogger("leash.models")

#: 429s answered in place, per call, before the job is rescheduled instead.
MAX_INLINE_429 = 5
#: Wait after a 429 that names no delay.
DEFAULT_RETRY_AFTER = 5.0
class ModelUnavailable(LeashError):
    """The model server failed or could not be reached; the attempt is retried."""


# --- the backend every provider builds on -------------------------------------------------------

class ModelBackend(Extracting, Spending):
    """``classify``, ``complete`` and ``extract`` (jobs.models.structured) over one call loop.
    A provider subclass sets ``name`` and supplies ``_send``, ``_failure`` and ``_read``; it
    builds its SDK client in ``__init__`` after calling this one (``self.settings`` then holds the model settings)."""

    name = "model"
    #: True for a backend with a batch side (jobs.models.batch_api.batching lists its methods).
    supports_batch = False
    #: The provider's address when LEASH_MODEL_URL is unset (its SDK's default): prices are
    #: looked up for the provider actually called.
    default_url = ""

    def __init__(self, ctx: JobContext | None = None, settings: ModelSettings | None = None):
        self.ctx = ctx
        self.settings = settings or ModelSettings.from_env()
        s = self.settings
        connection = ctx.connection if ctx else connect()
        self.limit = ModelRateLimit(connection, s.name, rpm=s.rpm, tpm=s.tpm)
        self.gate = ConcurrencyGate(SharedLimit(connection, s.name, _item_concurrency()), ctx.job_id if ctx else "")
        self._held = threading.local()  # per thread: the call being sent and the reservation it holds
        self.outage = OutageWatch()
        self._init_spending(connection)
        try:
            self.daily_limits = budget.owner_daily_limits()  # read once per attempt: every call checks them
            self.price = prices.price_for(s.name, s.url or self.default_url)  # None: no price known, cost unknown
        except ValueError as exc:  # LEASH_MODEL_PRICES is malformed: no retry fixes that
            raise PermanentError(str(exc)) from None

    # --- what a provider supplies ---------------------------------------------------------

    def _send(self, request: CallRequest) -> Any:
        """Build the SDK's request for ``request``, send it, return the SDK's response."""
        raise NotImplementedError

    def _failure(self, exc: Exception) -> Failure | None:
        """What an exception ``_send`` raised means; None for one that is not the SDK's (it
        is raised as it is)."""
        raise NotImplementedError

    def _read(self, response: Any, request: CallRequest) -> Answer:
        """The text, how it ended and the usage of a response (``estimated_usage`` when the
        server reported none). Never raises for an empty or cut-off answer: the loop judges."""
        raise NotImplementedError

    # --- the two operations ---------------------------------------------------------------

    def classify(self, text: str, labels: list[str]) -> str:
        messages = classify_messages(text, labels)
        # A label is a few tokens; a cut-off answer is judged like any other (it names a label
        # or it gets the correction), so truncation is fine here.
        budget = min(CLASSIFY_MAX_TOKENS, self.settings.max_tokens)
        first = self._chat(messages, max_tokens=budget, truncation_ok=True)
        label = match_label(first, labels)
        if label is not None:
            self._accept()
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
        self._accept()
        return label

    def complete(self, prompt: str, max_tokens: int | None = None, truncation_ok: bool = False) -> str:
        """The model's answer; one cut off at ``max_tokens`` (at most LEASH_MODEL_MAX_TOKENS)
        is an ItemError unless ``truncation_ok``."""
        text = self._chat([{"role": "user", "content": prompt}], max_tokens=max_tokens, truncation_ok=truncation_ok)
        self._accept()  # ended on its own (a cut-off answer is never offered to the cache)
        return text

    def reduce(self, instruction: str, texts: list[str], partial: bool = False) -> str:
        """One answer to ``instruction`` over ``texts`` (a ``reduce`` job's call: a chunk's partial,
        or the answer); cut off at ``max_tokens``, an ItemError."""
        text = self._chat(reduce_messages(instruction, texts, partial))
        self._accept()
        return text

    def _chat(self, messages: list[dict], max_tokens: int | None = None, truncation_ok: bool = False) -> str:
        budget = self.settings.max_tokens if max_tokens is None else min(max_tokens, self.settings.max_tokens)
        return self._call(CallRequest(list(messages), budget, truncation_ok))

    def _call_shaped(self, messages: list[dict], shape: dict) -> str:
        return self._call(CallRequest(list(messages), self.settings.max_tokens, response_format=shape))

    def _repair_attempts(self) -> int:
        return model_calls().repair_attempts

    # --- the loop -------------------------------------------------------------------------

    def _call(self, request: CallRequest) -> str:
        digest = self._digest(request)
        kept = self._received.get(digest)
        if kept is not None:  # paid for and counted by an attempt that could not store it
            answer = Answer(kept["text"], kept["finish"], kept.get("stop"), spending.NO_USAGE)
            self._offer(digest, request, answer)
            return self._text(answer, request)
        cached = self._from_cache(digest)
        if cached is not None:  # asked before and answered: no call, no cost
            return self._text(cached, request)
        wait = DEFAULT_RETRY_AFTER
        sends_429 = overloaded = unavailable = 0
        room_wait = waited = 0.0  # > 0: waiting for calls in flight to free room in a budget
        while sends_429 <= MAX_INLINE_429:
            if room_wait:
                self._sleep(room_wait)
                waited += room_wait
            epoch = self.gate.acquire(self.ctx.stopping() if self.ctx else None)
            outcome = answer = None
            try:
                try:
                    self._before_call(request, self._worst_case(request))
                except WaitForRoom as full:
                    if waited >= spending.ROOM_WAIT_IN_PLACE:
                        raise budget.WaitingForRoom(spending.ROOM_DEFER_SECONDS, full.refusal) from None
                    # The slot goes back while this call waits: other jobs' calls may use it.
                    room_wait = min(spending.ROOM_WAIT_MAX, max(spending.ROOM_WAIT_FIRST, room_wait * 1.5))
                    continue
                except AskForLess as less:
                    request = replace(request, max_tokens=less.max_tokens, budget_cut=True)
                    room_wait = 0.0
                    continue
                room_wait = 0.0
                try:
                    with self._keepalive():
                        response = self._send(request)
                        # Counted the moment it arrives, before anything that can still fail
                        # (the keepalive raising a cancel it learned as this block ends, a
                        # Redis blip on the limits' bookkeeping): it was paid for.
                        answer = self._read(response, request)
                        self._after_call(request, answer.usage)
                        self._keep_answer(digest, request, answer)
                except BaseException as exc:
                    if answer is not None:
                        outcome = OK
                        raise  # answered and counted; what the keepalive learned goes on
                    self._after_call(request, None)
                    failure = self._failure(exc) if isinstance(exc, Exception) else None
                    if failure is None:
                        raise
                    if failure.kind == RATE_LIMITED:
                        outcome = GATE_RATE_LIMITED
                        wait = DEFAULT_RETRY_AFTER if failure.wait is None else failure.wait
                        self.limit.pause(wait)  # every worker calling this model waits too
                        sends_429 += 1
                        overloaded += failure.overloaded
                        continue
                    if failure.kind == RESEND:
                        sends_429 += 1
                        continue
                    if failure.kind == TIMED_OUT:
                        outcome = GATE_TIMED_OUT
                        # Abandoned, not unanswered: the provider may still be generating, and bills it.
                        self.record_usage(self._abandoned_usage(request))
                        raise ModelUnavailable(f"the model call timed out after {self.settings.timeout:g}s "
                                               f"(LEASH_MODEL_TIMEOUT); counted as an estimate") from exc
                    if failure.kind == UNAVAILABLE:  # raises for an outage or this call's last send
                        unavailable += 1
                        self._sleep(self.outage.failed(failure.message, unavailable, ModelUnavailable))
                        continue
                    raise PermanentError(failure.message) from exc
                outcome = OK
                self.outage.answered()
            finally:
                self.gate.release(epoch, outcome)
            return self._text(answer, request)
        overloaded_out(overloaded, sends_429)
        raise RetryLater(wait, f"the model server kept answering 429 (last Retry-After {wait:g}s)")

    def _before_call(self, request: CallRequest, worst_case_tokens: int) -> None:
        """Before each send (see the module's docstring). Inside a job: one round trip
        (model_admit_v3) checks the lease (a zombie spends nothing), reserves the call's worst
        case against the job's and the owner's daily budgets and takes the call's rate turn.
        A call that does not fit waits while other calls in flight hold room (``WaitForRoom``),
        else asks for the output tokens left (``AskForLess``), else is never sent
        (BudgetReached). The same call sent again (a 429, a changed request) keeps its
        reservation rather than reserving twice. Outside a job: the rate turn only."""
        if self.ctx is None:
            self._wait_turn()
            return
        self.ctx.settle_answered(self.settings.name)  # an item's next call waits only for calls in flight
        input_bound = worst_case_tokens - request.max_tokens
        worst_nusd = None
        if self.price is not None:
            worst_nusd = self.price.nano_usd(input_bound, request.max_tokens)
        if getattr(self._held, "request", None) is not request:
            self._held.request, self._held.reservation = request, None
        while True:
            admission = budget.admit(
                self.ctx.connection, self.limit.keys, self.limit.ms_per_request, self.limit.ms_per_token,
                self.settings.max_inline_wait, self.ctx.attempt, worst_case_tokens, worst_nusd,
                daily_limits=self.daily_limits, reservation=self._held.reservation,
                hold=budget.call_hold(self.settings.timeout + self.settings.connect_timeout, self.ctx.attempt),
                extend=self.ctx.meter.reservations(self.settings.name), call=self._call_estimate(request))
            if admission.code == budget.PAUSED:
                raise RetryLater(admission.wait_seconds,
                                 f"the model server asked to wait {admission.wait_seconds:g}s (429)")
            if admission.code == budget.LEASE_LOST:
                raise LeaseLost()
            if admission.code == budget.OVER_BUDGET:
                if admission.can_wait:
                    raise WaitForRoom(admission.refusal or "")
                fits = self._output_that_fits(request, admission, input_bound)
                if fits is not None:
                    raise AskForLess(fits)
                raise budget.BudgetReached(admission.refusal)
            if admission.code == budget.ADMITTED:  # reserved: the item's write settles it
                self._held.reservation = admission.reservation
                self.ctx.meter.reserved(self.settings.name, admission.reservation, admission.day)
            if admission.wait_seconds > 0:
                self._sleep(admission.wait_seconds)
            if admission.code != budget.TOKENS_SPENT:
                return

    def _after_call(self, request: CallRequest, usage: Usage | None) -> None:
        """After each send (see the module's docstring): spend the tokens on the TPM limit and
        count the call on its item's thread, priced, until the item's write carries it."""
        if usage is None:
            return  # nothing was answered: the reservation is released when the item is written
        self.record_usage(usage)  # first: what follows may fail, and the call was paid for
        self._learn(request, usage)
        try:
            self.limit.spend(usage.total_tokens)
        except redis.exceptions.RedisError as exc:
            # The shared TPM bucket misses one answer's tokens; the answer itself is kept.
            log.warning("model %s: could not spend %d tokens on the shared TPM limit: %s",
                        self.settings.name, usage.total_tokens, exc)

    @staticmethod
    def _text(answer: Answer, request: CallRequest) -> str:
        if answer.finish == CUT_OFF and request.budget_cut and not request.truncation_ok:
            raise budget.BudgetReached(
                f"budget reached: the last call asked for the {request.max_tokens:,} output tokens the budget had "
                f"room for, and its answer was cut off there (paid for and counted) -- raise the budget with "
                f"`leash replay --budget-tokens N -- <job id>` (or --budget-usd)")
        if answer.finish == CUT_OFF and not request.truncation_ok:
            raise ItemError(f"answer cut off at max_tokens={request.max_tokens}; raise LEASH_MODEL_MAX_TOKENS")
        if answer.text is None:
            raise ItemError(f"the model returned no text (finish_reason={answer.stop_reason})")
        return answer.text

    def _keepalive(self):
        if self.ctx is None:
            return nullcontext()
        # The longest a call can legitimately take: connecting, then waiting for the answer.
        return self.ctx.keepalive(self.settings.timeout + self.settings.connect_timeout + 1)

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
