"""Budgets: a job's (payload ``budget: {"tokens": N, "usd": X}``) and an owner's per UTC day
(``LEASH_OWNER_DAILY_TOKENS``, ``LEASH_OWNER_DAILY_USD``).

A budget is checked before a call is sent, never after: ``admit`` reserves the call's worst
case in Redis (model_admit_v3), shared by every worker, and the item write settles it with
the real usage. Each call's reservation stands alone, on the owner's UTC day it was made, with
a deadline after which the call can no longer be paid for (``hold``): the item write settles
it, or the owner's next admission after the deadline gives it back -- whichever attempt of
whichever job that is. A call sent again (a 429) keeps its reservation.

A budget is a limit to spend up to, not a tripwire. When the next call's worst case does not
fit but other calls in flight hold part of the room, the call waits for them to settle (the
job shows that it waits, and for which budget); when nothing in flight can free room, the call
asks for fewer output tokens -- what is left -- and only when not even ``MIN_OUTPUT_TOKENS``
fit does the job stop: it stores what is in flight and fails with an error that starts
``budget reached`` -- replayable with a larger budget (``leash replay --budget-tokens N``),
resuming from its checkpoint.

A reservation whose deadline passes unsettled belongs to a call leash abandoned (its
work-horse was killed): it is counted as an estimated call rather than given back.
"""

from __future__ import annotations

import calendar
import json
import secrets
import time
from dataclasses import dataclass

from redis import Redis

from jobs import keys
from jobs.config import budgets, model_calls
from jobs.core.text import decoded
from jobs.errors import InvalidJob, PermanentError, RetryLater
from jobs.lifecycle import scripts
from jobs.usage import batch_parts, prices
from jobs.usage.meter import day_ttl, utc_day
from jobs.usage.prices import money

BUDGET_FIELD = "budget"
#: Far beyond any real job, small enough to stay an exact integer everywhere.
MAX_TOKENS = 10**12
MAX_USD = 10**6


class BudgetReached(PermanentError):
    """budget reached"""


class WaitingForRoom(RetryLater):
    """A call waited in place for room in a budget that calls in flight hold: the job gives its
    worker back and comes again later. Not an attempt, and not a deferral that counts toward
    LEASH_MAX_DEFERS: the room is held by the owner's own work, which ends."""

    def __init__(self, seconds: float, refusal: str):
        super().__init__(seconds, "waiting for room in a budget that calls in flight hold"
                                  + (f" ({refusal.removeprefix('budget reached: ')})" if refusal else ""))


@dataclass(frozen=True)
class Budget:
    tokens: int | None = None
    usd: float | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in (("tokens", self.tokens), ("usd", self.usd)) if v is not None}

    def hash_fields(self) -> dict:
        """The job hash's fields (model_admit_v3 reads them; a replay can raise them)."""
        fields: dict = {}
        if self.tokens is not None:
            fields["budget_tokens"] = self.tokens
        if self.usd is not None:
            fields["budget_nusd"] = prices.nano(self.usd)
        return fields


def parse(value, where: str = "'budget'") -> Budget | None:
    """The payload's ``budget`` (absent: None); InvalidJob saying what is wrong."""
    if value is None:
        return None
    if not isinstance(value, dict) or not value or set(value) - {"tokens", "usd"}:
        raise InvalidJob(f'{where} must be an object with "tokens" (an integer) and/or "usd" (a number), '
                         f'e.g. {{"tokens": 200000, "usd": 5}}')
    tokens, usd = value.get("tokens"), value.get("usd")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                               or not 1 <= tokens <= MAX_TOKENS):
        raise InvalidJob(f"{where}.tokens must be an integer from 1 to {MAX_TOKENS:,}, got {tokens!r}"[:200])
    if usd is not None and (isinstance(usd, bool) or not isinstance(usd, int | float) or not 0 < usd <= MAX_USD):
        raise InvalidJob(f"{where}.usd must be a number above 0 and at most {MAX_USD:,}, got {usd!r}"[:200])
    return Budget(tokens, None if usd is None else float(usd))


def owner_daily_limits() -> tuple[int, int]:
    """(tokens, nano-USD) an owner may use per UTC day; 0 = no limit."""
    allowed = budgets()
    return allowed.owner_daily_tokens, prices.nano(allowed.owner_daily_usd)


def seconds_to_next_utc_day(now: float | None = None) -> int:
    now = time.time() if now is None else now
    tomorrow = calendar.timegm(time.gmtime(now)[:3] + (0, 0, 0)) + 86400
    return max(1, int(tomorrow - now) + 1)


def owner_over_daily(connection: Redis, owner: str, now: float | None = None) -> str | None:
    """Why ``owner`` may not submit now (its daily budget is spent), or None."""
    limit_tokens, limit_nusd = owner_daily_limits()
    if not limit_tokens and not limit_nusd:
        return None
    day = utc_day(now)
    used_in, used_out, used_nusd = connection.hmget(keys.usage_owner_day(owner, day), "input_tokens",
                                                    "output_tokens", "cost_nusd")
    used_tokens = int(used_in or 0) + int(used_out or 0)
    if limit_tokens and used_tokens >= limit_tokens:
        return (f"budget reached: owner {owner!r} used {used_tokens:,} tokens today (UTC {day}), its daily budget "
                f"is {limit_tokens:,} (LEASH_OWNER_DAILY_TOKENS)")
    if limit_nusd and int(used_nusd or 0) >= limit_nusd:
        return (f"budget reached: owner {owner!r} spent {money(prices.usd(int(used_nusd or 0)))} today (UTC {day}), "
                f"its daily budget is {money(prices.usd(limit_nusd))} (LEASH_OWNER_DAILY_USD)")
    return None


# model_admit_v3's answers.
ADMITTED, TOKENS_SPENT, PAUSED, LEASE_LOST, OVER_BUDGET = 0, 1, 2, 3, 4
#: Past a call's longest wait for its answer and its attempt's lease, the time its usage may
#: still take to be written (the item's write, or the attempt's last one).
RESERVATION_SLACK = 60.0
#: Expired reservations an admission gives back at most (the rest: on the owner's next calls).
PRUNED_PER_ADMISSION = 20


#: The fewest output tokens worth asking for when a budget has no room for a call's whole
#: max_tokens: below this the job stops rather than ask for an answer too short to use.
MIN_OUTPUT_TOKENS = batch_parts.MIN_OUTPUT_TOKENS


@dataclass
class Admission:
    code: int
    wait_seconds: float = 0.0
    refusal: str | None = None  # the error text when OVER_BUDGET
    reservation: str = ""  # when ADMITTED: the id the call's usage write settles
    day: str = ""  # when ADMITTED: the UTC day the call is counted on (its reservation's)
    #: When OVER_BUDGET: which budget ('job_tokens', 'owner_usd', ...), and its room left for
    #: this call once every reservation is counted (tokens or nano-USD), and how much of what
    #: is reserved other calls hold (they can free it: worth waiting for; 0: nothing can).
    what: str = ""
    room: int = 0
    others: int = 0

    @property
    def can_wait(self) -> bool:
        return self.code == OVER_BUDGET and self.others > 0

    @property
    def admitted(self) -> bool:
        return self.code == ADMITTED


def new_reservation(job_id: str) -> str:
    return f"{job_id}:{secrets.token_hex(8)}"


def batch_reservation(job_id: str, number: int) -> str:
    """The reservation of a job's provider batch (part ``number``): the same id for every
    attempt and look, so a new attempt keeps one that still stands and the part's last
    write settles it."""
    return f"{job_id}:batch:{number}"


def call_hold(call_seconds: float, attempt) -> float:
    """How long a direct call's reservation stands: its longest wait for the answer, then the
    attempt's lease (a worker that stalls is noticed within it) and the slack for the write."""
    return call_seconds + attempt.lease_seconds + RESERVATION_SLACK


#: The names of ``admit``'s ``rate_keys`` (the model's rate limit: jobs.models.rate) in model_admit_v3.
RATE_KEY_NAMES = ("requests", "tokens", "paused")


def admit(connection: Redis, rate_keys: list[str], ms_per_request: float, ms_per_token: float,
          max_pause: float, attempt, worst_tokens: int, worst_nusd: int | None,
          now: float | None = None, now_ms: int | None = None,
          daily_limits: tuple[int, int] | None = None, reservation: str | None = None,
          hold: float | None = None, extend: list[str] | tuple = (), call: CallEstimate | None = None
          ) -> Admission:
    """One round trip: the call's rate-limit turn, the lease, and the worst case reserved
    against the job's and the owner's budgets (``daily_limits``: owner_daily_limits(), which a
    caller making many calls reads once) under ``reservation`` (None: a new id; one that still
    stands is kept, not reserved again) for ``hold`` seconds (None: a direct call's,
    ``call_hold``); ``extend``: reservations whose usage will be written with this call's, held
    as long. ``call``: what a direct call asks for, kept in its reservation so that a call
    abandoned unsettled is counted as an estimate (None: a provider batch). Expired
    reservations of the owner are given back first (counted, for abandoned calls)."""
    limit_tokens, limit_nusd = owner_daily_limits() if daily_limits is None else daily_limits
    now = time.time() if now is None else now
    day = utc_day(now)
    if hold is None:
        hold = call_hold(model_calls().model_timeout + 10, attempt)
    reservation = reservation or new_reservation(attempt.job_id)
    owner = attempt.owner_name()
    call = call or CallEstimate()
    reply = scripts.run(
        connection, "model_admit_v3",
        keys={**dict(zip(RATE_KEY_NAMES, rate_keys, strict=True)), "job": keys.job(attempt.job_id),
              "owner_day": keys.usage_owner_day(owner, day), "reservations": keys.owner_reservations(owner),
              "reservation_records": keys.owner_reservation_records(owner),
              "model_usage": keys.usage_model(call.model or "-"), "reservation_owners": keys.reservation_owners()},
        args=["" if now_ms is None else now_ms, ms_per_request, ms_per_token, int(max_pause * 1000), attempt.token,
              int(worst_tokens), "" if worst_nusd is None else int(worst_nusd), day, limit_tokens, limit_nusd,
              day_ttl(), now, reservation, now + hold, PRUNED_PER_ADMISSION, call.input_tokens, call.input_nusd,
              call.model, attempt.kind, "" if call.max_output is None else call.max_output, owner, *extend],
    )
    code = int(reply[0])
    if code == OVER_BUDGET:
        what, used, reserved, limit, others = (str(decoded(r)) for r in reply[1:6])
        return Admission(code, refusal=refusal_text(owner, what, used, reserved, limit, worst_tokens=worst_tokens,
                                                    day=day, model=call.model or None),
                         what=what, room=int(limit) - int(used) - int(reserved), others=int(others))
    if code == ADMITTED:
        return Admission(code, int(reply[1]) / 1000, reservation=reservation, day=str(decoded(reply[2])))
    return Admission(code, wait_seconds=int(reply[1]) / 1000 if len(reply) > 1 else 0.0)


@dataclass(frozen=True)
class CallEstimate:
    """What a direct call asks for, for its reservation's record: the model, its input tokens
    estimated and their cost, and the most output tokens it may be billed."""

    model: str = ""
    input_tokens: int = 0
    input_nusd: int = 0
    max_output: int | None = None


#: Owners whose reservations the reaper looks at per round (the rest: next round).
OWNERS_SWEPT_PER_ROUND = 20


def sweep_reservations(connection: Redis, now: float | None = None) -> int:
    """Count the abandoned calls of owners whose reservations' deadlines passed and who made no
    call since (an admission does the same for its own owner). Returns reservations handled."""
    now = time.time() if now is None else now
    handled = 0
    for raw in connection.zrangebyscore(keys.reservation_owners(), "-inf", now, start=0, num=OWNERS_SWEPT_PER_ROUND):
        owner = str(decoded(raw))
        handled += int(scripts.run(connection, "reservations_sweep_v1",
                                   keys={"reservation_owners": keys.reservation_owners(),
                                         "reservations": keys.owner_reservations(owner),
                                         "reservation_records": keys.owner_reservation_records(owner)},
                                   args=[now, owner, PRUNED_PER_ADMISSION * 5]))
    return handled


def reservation_day(connection: Redis, owner: str, reservation: str) -> str | None:
    """The UTC day a reservation that still stands was made on (its usage is counted there)."""
    raw = connection.hget(keys.owner_reservation_records(owner), reservation)
    return json.loads(raw).get("day") if raw else None


def refusal_text(owner: str, what: str, used: str, reserved: str, limit: str, worst_tokens: int = 0,
                 day: str = "", model: str | None = None) -> str:
    """The error a budget stop leaves on the job: starts ``budget reached``, names the figure
    and the budget, and what raises it."""
    used_n, reserved_n, limit_n = int(used), int(reserved), int(limit)
    in_flight = f", {reserved_n:,} more reserved by calls in flight" if reserved_n else ""
    if what == "job_tokens":
        return (f"budget reached: the job used {used_n:,} tokens{in_flight}; its next call (up to {worst_tokens:,} "
                f"tokens) would pass its budget of {limit_n:,} tokens -- raise it with "
                f"`leash replay --budget-tokens N -- <job id>`")
    if what == "job_usd":
        return (f"budget reached: the job spent {money(prices.usd(used_n))}; its next call would pass its budget of "
                f"{money(prices.usd(limit_n))} -- raise it with `leash replay --budget-usd X -- <job id>`")
    if what in ("job_usd_unpriced", "owner_usd_unpriced"):
        whose = "the job's" if what.startswith("job") else f"owner {owner!r}'s daily"
        return (f"budget reached: {whose} budget is in USD ({money(prices.usd(limit_n))}) but "
                f"{prices.why_no_price(model)} -- or give a budget in tokens")
    if what == "owner_tokens":
        return (f"budget reached: owner {owner!r} used {used_n:,} tokens today (UTC {day}){in_flight}; the next call "
                f"would pass its daily budget of {limit_n:,} tokens (LEASH_OWNER_DAILY_TOKENS)")
    return (f"budget reached: owner {owner!r} spent {money(prices.usd(used_n))} today (UTC {day}); the next call "
            f"would pass its daily budget of {money(prices.usd(limit_n))} (LEASH_OWNER_DAILY_USD)")
