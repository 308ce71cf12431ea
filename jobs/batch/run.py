"""Batch mode: a job's items through the provider's batch API, without holding a worker while
the provider works (payload ``mode: "batch"``; kinds that make one call per item declare how,
with a ``BatchSpec``).

One batch job's life, each step a short turn on a worker under a lease:

    create   the attempt reserves a part's worst case against the job's and the owner's
             budgets (one reservation per part, its results counted on the day it was made),
             records its intent (attempt, part, time, items) in the job's batch record,
             then asks the provider for the batch and records its id -- as many parts as the
             room left takes (jobs/batch/room.py); the job is parked
             (``Attempt.park``: running, phase ``waiting``, no lease, no worker)
    look     RQ's scheduler brings the job back for a look (not an attempt: claim_v4), every
             LEASH_BATCH_POLL_SECONDS at first, less often as the wait grows (up to
             LEASH_BATCH_POLL_MAX: looks.next_look_in); a part the provider has ended is
             read, each answer stored with the same fenced item write as a direct call's, its
             usage at the batch price; items a budget held back go as new parts in the room
             that frees; a look the provider failed to answer is looked at again
    end      requests the provider failed, or let expire, are asked again directly (or fail the
             job: LEASH_BATCH_FALLBACK), counted apart; after LEASH_BATCH_MAX_WAIT the batch is
             canceled, what it answered before the cancel is read once it has ended (within
             LEASH_BATCH_CANCEL_GRACE), and what is left runs direct

Exactly one batch per job and attempt: creating a batch and recording its id are two steps, so
an attempt that finds an intent without an id (its worker died between them, or a deploy took
it) asks the provider (``batch_find``) before it creates another.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NoReturn

from jobs.batch import cached, canceled, looks, room
from jobs.batch.canceled import cancel_at_provider, open_batch_ids  # noqa: F401 - the doors call it from here
from jobs.batch.parts import Part, custom_id, index_of
from jobs.batch.turn import Record
from jobs.config import batches
from jobs.core import clock
from jobs.errors import Canceled, ItemError, LeaseLost, NeedsDirect, Parked, PermanentError
from jobs.models.provider import prompt_bytes
from jobs.models.spending import script_of, tightened_bound
from jobs.usage import budget
from jobs.usage.meter import Pending, flush

if TYPE_CHECKING:
    from jobs.core.running.context import JobContext
    from jobs.intake.modes import BatchSpec
    from jobs.models.provider import CallRequest

log = logging.getLogger("leash.batch")

class BatchRun:
    """One turn of a batch job on a worker: create its batch(es), or look at them."""

    def __init__(self, ctx: JobContext, backend, spec: BatchSpec, payload: dict, direct: Callable[[Any], Any]):
        self.ctx, self.backend, self.spec, self.payload, self.direct = ctx, backend, spec, payload, direct
        self.items: list = list(payload["items"])
        self.price = backend.price  # a batch's tokens: this price at its batch multiplier
        self.model = backend.settings.name
        self.max_tokens = backend.settings.max_tokens
        self.record = Record(ctx)
        #: An answer cut off at the output a budget left it (read this turn): the job stops there.
        self.cut: str | None = None

    def request(self, index: int, max_tokens: int | None = None) -> CallRequest:
        """Item ``index``'s request; ``max_tokens``: fewer output tokens than the deployment's,
        which a budget left it (a later part's, jobs/usage/batch_parts.py)."""
        if max_tokens is None or max_tokens >= self.max_tokens:
            return self.spec.request(self.payload, self.items[index], self.max_tokens)
        return replace(self.spec.request(self.payload, self.items[index], max_tokens), budget_cut=True)

    def input_bound(self, index: int) -> int:
        """Item ``index``'s input bound: its prompt's bytes, tightened once the job's earlier
        parts were billed for prompts of its script (``spending.tightened_bound``)."""
        request = self.request(index)
        seen = self.record.seen_rate(script_of(request))
        return tightened_bound(request, seen and seen[:2], seen and seen[2], seen and seen[3])

    def cost(self, what: str) -> Callable[[int, int], int]:
        """What a request costs in the unit of budget ``what`` (tokens, or nano-USD at the batch rate)."""
        if what.endswith("tokens") or self.price is None:
            return lambda input_tokens, output_tokens: input_tokens + output_tokens
        return lambda input_tokens, output_tokens: self.price.nano_usd(input_tokens, output_tokens, batch=True)

    def run(self) -> list[Any]:
        done = self.ctx.items_done()
        self.ctx.progress(len(done), total=len(self.items))
        try:
            if not self.record.parts:  # what the request cache answers is not sent
                cached.answer_from_cache(self, done, _AGAIN, STORE_CHUNK)
                if len(done) == len(self.items):
                    return [done[i] for i in range(len(self.items))]
            if not self.record.parts or any(p.batch_id is None for p in self.record.parts.values()):
                self._create(done)
                if self.record.parts or room.unsent(self, done):  # sent, or waiting for room in a budget
                    self.park([0, 0, sum(len(p.indexes) for p in self.record.parts.values())])
            if not self.ctx.attempt.look:
                # A new attempt (the last one failed or its worker died): a part still at the
                # provider whose reservation ran out is reserved again (one that stands is kept).
                for p in self.record.parts.values():
                    if not p.ended and any(i not in done for i in p.indexes):
                        self._reserve([i for i in p.indexes if i not in done], p.number, p.max_tokens)
            return looks.look(self, done)
        except Canceled:
            self._stop_open()
            raise

    # --- create ---------------------------------------------------------------------------

    def _create(self, done: dict) -> None:
        """Parts recorded without an id first (found at the provider, or created as recorded),
        then new parts of the items not sent yet, as many as the budgets' room takes."""
        for part in sorted(self.record.parts.values(), key=lambda p: p.number):
            if part.batch_id is not None:
                continue
            self._reserve(part.indexes, part.number, part.max_tokens)  # whichever attempt recorded it
            if not self._find(part):
                self.send(part.number, part.indexes, part.max_tokens)
        room.send_more(self, done)

    def send(self, number: int, indexes: list[int], max_tokens: int | None = None) -> Part:
        """Part ``number`` (reserved already): its intent recorded, its batch created, its id recorded."""
        part = Part(number, self.ctx.attempt.number, clock.wall(), indexes,
                    max_tokens=max_tokens if max_tokens is not None and max_tokens < self.max_tokens else None)
        self.record.intend(part)
        requests = [(custom_id(self.ctx.job_id, i), self.request(i, part.max_tokens)) for i in indexes]
        with self.ctx.keepalive(self.backend.settings.timeout * 4):
            part.batch_id = self.backend.batch_create(self.ctx.job_id, part.attempt, number, requests)
        self.record.note(f"id:{number}", part.batch_id)
        log.info("job %s: batch %s created at the provider (part %d, %d requests)", self.ctx.job_id,
                 part.batch_id, number, len(indexes))
        return part

    def split(self, indexes: list[int], max_tokens: int | None = None) -> list[list[int]]:
        """``indexes`` in parts the provider's batch limits take."""
        todo = [(custom_id(self.ctx.job_id, i), self.request(i, max_tokens)) for i in indexes]
        try:
            return [[index_of(self.ctx.job_id, name) for name, _ in part] for part in self.backend.batch_split(todo)]
        except ValueError as exc:  # one request larger than any batch may be
            raise PermanentError(f"the job cannot be sent as a batch: {exc}; submit it with mode \"direct\"") from None

    def _find(self, part: Part) -> bool:
        """Did the attempt that recorded this intent create the batch before it could record
        the id? Ask the provider: never a second batch for one intent."""
        names = [custom_id(self.ctx.job_id, i) for i in part.indexes]
        with self.ctx.keepalive(self.backend.settings.timeout * 4):
            found = self.backend.batch_find(self.ctx.job_id, part.attempt, part.number, part.intent_at,
                                            custom_ids=names)
            if len(found) > 1:  # a provider without metadata may not tell same-sized batches apart yet
                found = [b for b in found if self.backend.batch_confirm(b, names) is not False] or found
        if not found:
            return False
        part.batch_id = found[0]
        self.record.note(f"id:{part.number}", part.batch_id)
        log.info("job %s: batch %s found at the provider (created by attempt %d before it could record it)",
                 self.ctx.job_id, part.batch_id, part.attempt)
        return True

    def _reserve(self, indexes: list[int], number: int, max_tokens: int | None = None) -> None:
        """A recorded part's worst case, reserved again (one that stands is kept), or the job stops."""
        try:
            admission = self.admit(indexes, number, max_tokens)
        except Exception:
            self._stop_open()
            raise
        if admission.code == budget.OVER_BUDGET:
            self.budget_reached(admission)

    def budget_reached(self, admission: budget.Admission) -> NoReturn:
        self._stop_open()  # a part still open is canceled, its reservation given back
        raise budget.BudgetReached(admission.refusal)

    def stop_cut(self) -> NoReturn:
        """An answer was cut off at the output a budget left it (``self.cut``): the job stops, as
        a direct call's would, the answers read stored."""
        self._stop_open()
        raise budget.BudgetReached(self.cut)

    def admit(self, indexes: list[int], number: int, max_tokens: int | None = None) -> budget.Admission:
        """The part's worst case, reserved against the job's and the owner's budgets before
        the provider is asked (model_admit_v3, with no rate-limit turn: a batch is one call),
        for as long as the provider may take; the write of its last results settles it."""
        tokens, nusd = self.worst(indexes, max_tokens)
        # The longest wait, a canceled batch's grace, the look after them (and its calls).
        waits = batches()
        hold = (waits.batch_max_wait + waits.batch_cancel_grace + self.backend.settings.timeout * 4
                + max(waits.batch_poll_seconds, waits.batch_poll_max))
        admission = budget.admit(self.ctx.connection, self.backend.limit.keys, 0, 0, 10**9, self.ctx.attempt,
                                 tokens, nusd, daily_limits=self.backend.daily_limits,
                                 reservation=budget.batch_reservation(self.ctx.job_id, number),
                                 hold=budget.call_hold(hold, self.ctx.attempt))
        if admission.code == budget.LEASE_LOST:
            raise LeaseLost()
        return admission

    def worst(self, indexes: Iterable[int], max_tokens: int | None = None) -> tuple[int, int | None]:
        """The requests' worst case (tokens, nano-USD): input bounds and the output they ask for."""
        tokens, nusd = 0, 0 if self.price is not None else None
        output = self.max_tokens if max_tokens is None else min(max_tokens, self.max_tokens)
        for i in indexes:
            bound = self.input_bound(i)
            tokens += bound + output
            if nusd is not None:
                nusd += self.price.nano_usd(bound, output, batch=True)
        return tokens, nusd

    # --- look -----------------------------------------------------------------------------

    def read(self, part: Part, done: dict) -> None:
        """Store every answer of an ended part, STORE_CHUNK items a fenced write (store_items_v2)
        with the usage of their calls. What it did not answer (failed, expired or unusable) is
        left unstored, for the end to ask directly."""
        answered: set[int] = set()
        chunk: list[tuple[int, str, str]] = []
        reservation = budget.batch_reservation(self.ctx.job_id, part.number)
        # Counted on the day the part was reserved on, where its worst case was held.
        day = budget.reservation_day(self.ctx.connection, self.ctx.attempt.owner_name(), reservation) or ""
        usage = Pending(self.model, self.ctx.attempt.kind, day=day)
        requests = {custom_id(self.ctx.job_id, i): self.request(i, part.max_tokens) for i in part.indexes}
        billed: list = []  # (script, bytes, input and output tokens): what later parts bound their requests by
        reading = True
        try:
            for name, outcome, used in self.backend.batch_results(part.batch_id, requests):
                index = index_of(self.ctx.job_id, name)
                if index is None or index in answered:
                    continue
                answered.add(index)
                if index in done:
                    continue  # stored by an earlier look that was cut short
                request = requests[name]
                value = self.value(index, request, outcome)
                cached.keep_answer(self, usage, request, outcome, value, _AGAIN,
                                   self.request(index) if part.max_tokens is not None else None)
                self._count(request, used)
                if used is not None and not used.estimated:
                    billed.append((script_of(request), prompt_bytes(request.messages), used.input_tokens,
                                   used.output_tokens))
                if value is _AGAIN:
                    _add(usage, self.ctx.meter.take())  # its calls were paid for all the same
                    continue
                mine = self.ctx.meter.take()
                chunk.append((index, json.dumps(value), mine.item_usage() if mine else ""))
                _add(usage, mine)
                done[index] = value
                if len(chunk) >= STORE_CHUNK:
                    reading = False
                    usage = self.store(chunk, usage)
                    reading = True
        except Exception:
            if reading:  # the provider failed mid-read: what was read is kept, the next look reads on
                self.store(chunk, usage)
            raise
        hints = [x for i in part.indexes if i in self.record.again and i not in done
                 for x in (f"again:{i}", self.record.again[i])]
        if hints:
            self.record.note(*hints)
        self.record.learn(billed)
        usage.reservations.append(reservation)  # the part's last write settles its reservation whole
        self.store(chunk, usage)

    def give_back(self, parts: list[Part]) -> None:
        """The reservations of parts no write will settle (never read, or the job stops)."""
        flush(self.ctx.attempt, [Pending(self.model, self.ctx.attempt.kind, reservations=[
            budget.batch_reservation(self.ctx.job_id, p.number) for p in parts])])

    def drop_orphan(self, number: int) -> None:
        """A reservation for part ``number`` that no part recorded (its attempt died between the
        two) is given back: kept, it would stand for a part of another size."""
        reservation = budget.batch_reservation(self.ctx.job_id, number)
        if budget.reservation_day(self.ctx.connection, self.ctx.attempt.owner_name(), reservation):
            self.give_back([Part(number, 0, 0.0, [])])

    def store(self, chunk: list, usage: Pending) -> Pending:
        if not chunk:
            flush(self.ctx.attempt, [usage])  # nothing to store: its calls and reservation all the same
        else:
            cancel_requested = self.ctx.attempt.store_items(
                chunk, usage if usage.calls or usage.reservations or usage.hits or usage.cache else None)
            self.ctx.stored(chunk)
            if cancel_requested:
                raise Canceled()
        chunk.clear()  # a hand-off waits for the park: every answer read is stored first
        return Pending(self.model, self.ctx.attempt.kind, day=usage.day)

    def value(self, index: int, request: CallRequest, outcome) -> Any:
        if not hasattr(outcome, "finish"):  # a Failure, not an Answer (jobs.models.provider)
            return _AGAIN
        try:
            text = self.backend._text(outcome, request)  # judged as a direct answer is
            return self.spec.read(self.payload, self.items[index], text)
        except ItemError as exc:
            return {"error": str(exc)}
        except budget.BudgetReached as exc:  # cut off at the output a budget left it: the job stops
            self.cut = self.cut or str(exc)
            return _AGAIN
        except NeedsDirect as exc:
            if exc.answer is not None and self.spec.repair is not None:
                self.record.again[index] = exc.answer
            return _AGAIN

    def _count(self, request: CallRequest, usage) -> None:
        if usage is not None:
            self.backend.record_usage(usage)  # priced at the batch multiplier (usage.batch)

    # --- end ------------------------------------------------------------------------------

    def finish(self) -> list[Any]:
        stored = self.ctx.items_done()
        left = [i for i in range(len(self.items)) if i not in stored]
        if left and batches().batch_fallback == "fail":
            raise PermanentError(f"{len(left)} of {len(self.items)} requests were not answered by the provider's "
                                 "batch (failed or expired; LEASH_BATCH_FALLBACK=fail): replay the job to ask "
                                 "them again")
        if not left:
            return [stored[i] for i in range(len(self.items))]
        log.info("job %s: %d request(s) the provider did not answer are asked directly", self.ctx.job_id, len(left))
        self.record.note("batch_direct", len(left), job_hash=True)
        again, repair = self.record.again, self.spec.repair
        if not again or repair is None:
            return self.ctx.for_each(self.items, self.direct)
        return self.ctx.for_each(list(range(len(self.items))), lambda i: repair(
            self.backend, self.payload, self.items[i], again[i]) if i in again else self.direct(self.items[i]))

    def park(self, counts: list[int] | None, stage: str = looks.WAITING) -> None:
        """``counts`` the provider's (done, failed, total); None keeps those of the last look."""
        now = clock.wall()
        look_at = now + looks.next_look_in(now - (self.record.first_at or now), stage)
        parked = self.ctx.attempt.park(look_at, (*(counts or ("", "", "")), len(self.record.parts)),
                                       stage=stage, failed_looks=self.record.failed_looks)
        if parked == 0:
            raise LeaseLost()
        if parked == 2:
            raise Canceled()
        raise Parked(look_at)

    def cancel_open(self, batch_ids: list[str] | None = None) -> None:
        open_ids = [p.batch_id for p in self.record.parts.values() if p.batch_id and not p.ended]
        canceled.cancel_parts(self.backend, open_ids if batch_ids is None else batch_ids, self.ctx.job_id)

    def _stop_open(self) -> None:
        """The job stops: its open batches are canceled and their reservations given back."""
        self.cancel_open()
        self.give_back([p for p in self.record.parts.values() if not p.ended])


_AGAIN = object()


def _add(total: Pending, one: Pending | None) -> None:
    """One item's calls into the chunk's usage (one write carries them all)."""
    if one is not None:
        for name in ("calls", "input", "output", "cached", "nusd", "unpriced", "estimated", "hits"):
            setattr(total, name, getattr(total, name) + getattr(one, name))
#: Item writes sent in one round trip when a part's answers are stored.
STORE_CHUNK = 500


def run(ctx: JobContext, backend, spec: BatchSpec, payload: dict, direct: Callable[[Any], Any]) -> list[Any]:
    if not getattr(backend, "supports_batch", False):
        raise PermanentError(f"the {backend.name} backend has no batch API: submit the job with mode \"direct\"")
    return BatchRun(ctx, backend, spec, payload, direct).run()
