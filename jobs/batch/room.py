"""Batch mode under a budget: which of a batch job's items go to the provider next
(jobs/batch/run.py sends them).

A provider batch (a part of the job) reserves the worst case of every request in it until its
answers are read, and a request's worst case (its input bound plus max_tokens) is often many
times what it costs. So a job is sent in parts: the first takes the items whose worst cases
fit the room left in the job's budget and its owner's day (in item order, an item too large for
what is left skipped for the smaller ones after it); each later part goes at a look, once the
answers of the parts before it were stored and their reservations settled at what the provider
billed, freeing room. The job stops -- ``budget reached``, replayable with a larger budget --
only when not one more item fits and nothing in flight can free room: none of its parts is at
the provider and no other call of its owner holds a reservation. While room is held by calls of
its owner's other jobs, it waits (parked, looked at again later; model_admit_v3 marks it
``budget_wait``). Without budgets every item goes in the first turn, as before.

Once nothing in flight can free room (a refusal with no other call holding any, no part of the
job at the provider), the room left is shared out (``_share_out``, by jobs/usage/batch_parts.py's
rule): input bounded by what the job's read parts were billed, each item asking for the output
the room leaves it -- the last parts ask for the output that is left, as a direct job's last
call does.

The room is learnt from model_admit_v3's refusals (each names the budget and the room it has
left): at most one refusal per budget in a turn, and a few more where other calls race for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs.usage import batch_parts

if TYPE_CHECKING:
    from jobs.batch.turn import Turn
    from jobs.usage import budget

#: Refusals one turn takes to learn the room left (four budgets, and calls racing for room).
MAX_REFUSALS = 6


def send_more(run: Turn, done: dict) -> int:
    """Send the items not sent yet that fit the room left, as new parts; returns how many were
    sent. Raises BudgetReached (run.budget_reached) when none fits and nothing can free room."""
    left = unsent(run, done)
    if not left or run.record.canceled_at is not None:
        return 0
    run.drop_orphan(_next_number(run))
    worst = {i: run.worst([i]) for i in left}
    rooms: dict[str, int] = {}  # a budget -> its room left, as its last refusal said
    sent = refusals = 0
    while left and refusals < MAX_REFUSALS:
        chosen = _fitting(left, worst, rooms)
        if not chosen:
            break
        part = run.split(chosen)[0]
        admission = run.admit(part, _next_number(run))
        if admission.admitted:
            run.send(_next_number(run), part)
            sent += len(part)
            taken = set(part)
            left = [i for i in left if i not in taken]
            for what in rooms:
                rooms[what] -= sum(_amount(worst[i], what) for i in part)
            continue
        refusals += 1
        if admission.what.endswith("_unpriced"):
            run.budget_reached(admission)
        rooms[admission.what] = min(rooms.get(admission.what, admission.room), admission.room)
        if not admission.can_wait and not _open(run):
            # Nothing in flight can free room: the room left is shared out (the last parts
            # ask for the output that is left, jobs/usage/batch_parts.py).
            return sent + _share_out(run, left, rooms, refusals)
    if not left or sent or _open(run):
        return sent  # the parts at the provider free room when their answers are read
    # Nothing of the job's own in flight: ask for the smallest item alone, whose refusal says
    # whether other calls of the owner hold room (wait for them) or nothing can (stop).
    smallest = min(left, key=lambda i: worst[i][0])
    admission = run.admit([smallest], _next_number(run))
    if admission.admitted:
        run.send(_next_number(run), [smallest])
        return 1
    if admission.can_wait:
        return 0
    rooms[admission.what] = admission.room
    return _share_out(run, left, rooms, refusals + 1, admission)


def _open(run: Turn) -> bool:
    return any(not p.ended for p in run.record.parts.values())


def _share_out(run: Turn, left: list[int], rooms: dict[str, int], refusals: int,
               last: budget.Admission | None = None) -> int:
    """The room left, with nothing in flight to free more: parts whose items ask for the output
    the room leaves them (``batch_parts.next_part``), input bounded by what was billed."""
    max_tokens = run.max_tokens
    floor = batch_parts.output_floor(run.record.longest_answer, max_tokens)
    bound = {i: run.input_bound(i) for i in left}
    sent = 0
    while left and refusals <= MAX_REFUSALS:
        k, m = batch_parts.next_part([bound[i] for i in left], [(r, run.cost(what)) for what, r in rooms.items()],
                                     max_tokens, floor)
        if k == 0 or (m < floor and (sent or _open(run))):
            break  # one item alone with what is left goes only when nothing in flight can free more
        part = run.split(left[:k], m)[0]
        admission = run.admit(part, _next_number(run), m)
        if admission.admitted:
            run.send(_next_number(run), part, m)
            sent += len(part)
            taken = set(part)
            left = [i for i in left if i not in taken]
            for what, r in rooms.items():
                rooms[what] = r - sum(run.cost(what)(bound[i], m) for i in part)
            continue
        refusals += 1
        last = admission
        if admission.what.endswith("_unpriced"):
            run.budget_reached(admission)
        if admission.can_wait:
            return sent
        rooms[admission.what] = min(rooms.get(admission.what, admission.room), admission.room)
    if sent or not left or _open(run):
        return sent
    if last is None or last.admitted:
        last = run.admit([left[0]], _next_number(run))  # its refusal names the budget
        if last.admitted:  # room freed meanwhile
            run.send(_next_number(run), [left[0]])
            return 1
    if last.can_wait:
        return 0
    run.budget_reached(last)


def unsent(run: Turn, done: dict) -> list[int]:
    """Items in no part yet and not stored: what later parts send."""
    sent = {i for p in run.record.parts.values() for i in p.indexes}
    return [i for i in range(len(run.items)) if i not in done and i not in sent]


def _next_number(run: Turn) -> int:
    return max(run.record.parts, default=-1) + 1


def _amount(worst: tuple[int, int | None], what: str) -> int:
    return worst[0] if what.endswith("tokens") else worst[1] or 0


def _fitting(left: list[int], worst: dict[int, tuple[int, int | None]], rooms: dict[str, int]) -> list[int]:
    """The items, in order, whose worst cases fit together in every room known (an item too
    large for what is left is skipped for smaller ones after it)."""
    room = {unit: min((r for what, r in rooms.items() if what.endswith(unit)), default=None)
            for unit in ("tokens", "usd")}
    chosen = []
    for i in left:
        tokens, nusd = worst[i]
        if room["tokens"] is not None and tokens > room["tokens"]:
            continue
        if room["usd"] is not None and (nusd or 0) > room["usd"]:
            continue
        chosen.append(i)
        if room["tokens"] is not None:
            room["tokens"] -= tokens
        if room["usd"] is not None:
            room["usd"] -= nusd or 0
    return chosen
