"""How a batch job under a budget is cut into parts (provider batches): the rule its worker
follows (jobs/batch/room.py) and the dry run's count of the parts a budget allows
(jobs/intake/estimate.py), in one place. A leaf: it imports nothing of leash's.

A part reserves the worst case of every request in it -- its input bound plus the output it asks
for -- until its answers are read. The first part asks every item for ``max_tokens`` and holds
its input to the prompt's UTF-8 bytes (nothing is known yet). Once answers were read, the
room left is shared out the way direct mode's last call asks for what is left (``AskForLess``),
but for many items at once: the input bound tightens to what the provider billed (the margin of
``jobs.models.spending.tightened_bound``), and each item of the next part asks for the output
the room leaves it -- never less than ``OUTPUT_MARGIN`` times the longest answer seen, so an
answer is rarely cut, and never more than ``max_tokens``. The part takes as many items as fit at
that floor. When not one item fits at the floor, one item goes alone with the output that is
left (at least ``MIN_OUTPUT_TOKENS``); below that the job stops ``budget reached``. An answer a
budget-shortened part cut off stops the job ``budget reached`` as a direct call's does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

#: The fewest output tokens worth asking for when a budget has no room for a call's whole
#: max_tokens: below this the job stops rather than ask for an answer too short to use (direct
#: calls too: jobs.usage.budget).
MIN_OUTPUT_TOKENS = 16
#: The output a later part asks each item for is at least this many times the longest answer
#: the job's earlier parts were billed for.
OUTPUT_MARGIN = 1.25
#: The dry run stops counting parts here (a budget that needs more is named as such).
MOST_PARTS_COUNTED = 50

#: A budget's room left and what one request costs in its unit: cost(input tokens, output tokens).
Room = tuple[int, Callable[[int, int], int]]


def output_floor(longest_seen: int | None, max_tokens: int) -> int:
    """The least output a later part asks an item for: ``OUTPUT_MARGIN`` times the longest
    answer seen (``max_tokens`` while none was)."""
    if not longest_seen:
        return max_tokens
    return max(min(MIN_OUTPUT_TOKENS, max_tokens), min(max_tokens, math.ceil(longest_seen * OUTPUT_MARGIN)))


def next_part(bounds: Sequence[int], rooms: Sequence[Room], max_tokens: int, floor: int) -> tuple[int, int]:
    """``(k, m)``: the first ``k`` of the items whose input bounds are ``bounds`` go in the next
    part, each asking for ``m`` output tokens -- the most items that fit every room at ``floor``,
    then the most output up to ``max_tokens`` those items fit. Not one item at the floor: the
    first alone with what is left (``m`` at least MIN_OUTPUT_TOKENS, or its own max_tokens when
    fewer). ``(0, 0)``: not even that fits (the job stops)."""
    sums = [0] * len(rooms)
    k = 0
    for bound in bounds:
        costs = [cost(bound, floor) for _, cost in rooms]
        if any(s + c > room for s, c, (room, _) in zip(sums, costs, rooms, strict=True)):
            break
        sums = [s + c for s, c in zip(sums, costs, strict=True)]
        k += 1
    if k == 0:
        if not bounds:
            return 0, 0
        low = min(MIN_OUTPUT_TOKENS, max_tokens)
        m = _most_output(bounds[:1], rooms, low, max_tokens)
        return (1, m) if m else (0, 0)
    return k, _most_output(bounds[:k], rooms, floor, max_tokens)


def _most_output(bounds: Sequence[int], rooms: Sequence[Room], low: int, high: int) -> int:
    """The most output tokens in ``[low, high]`` each of these items may ask for within every
    room (0 when not even ``low`` fits)."""
    def fits(m: int) -> bool:
        return all(sum(cost(b, m) for b in bounds) <= room for room, cost in rooms)

    if not fits(low):
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def parts_under(rooms: Sequence[Room], strict: Sequence[int], likely: Sequence[int], max_tokens: int,
                answer: int, margin: float) -> tuple[int, int]:
    """The dry run's count: ``(parts, items)`` -- how many parts a job sends under budgets with
    ``rooms`` and how many of its items they answer, when each item's input is billed
    ``likely[i]`` tokens (bound by ``strict[i]`` at first, then ``margin`` times what was billed)
    and its answer is ``answer`` tokens (an answer cut off where a part asks for fewer stops it)."""
    left, parts, done, seen = [r for r, _ in rooms], 0, 0, False
    costs = [cost for _, cost in rooms]
    while done < len(strict) and parts < MOST_PARTS_COUNTED:
        bounds = [min(s, math.ceil(lk * margin)) if seen else s
                  for s, lk in zip(strict[done:], likely[done:], strict=True)]
        k, m = next_part(bounds, list(zip(left, costs, strict=True)), max_tokens,
                         output_floor(answer if seen else None, max_tokens))
        if k == 0:
            break
        billed = likely[done:done + k]
        left = [r - sum(cost(lk, min(answer, m)) for lk in billed) for r, cost in zip(left, costs, strict=True)]
        parts += 1
        if answer > m:  # cut off: the job stops there
            break
        done += k
        seen = True
    return parts, done


def dry_run(strict: Sequence[int], likely: Sequence[int], max_tokens: int, answer: int | None,
            budget_tokens: int | None, budget_nusd: int | None, price, margin: float) -> dict:
    """What the dry run says of a batch job: the budget that sends it as one batch (every
    request's worst case: nothing is known of its answers before the first part), and under
    the job's budget how many parts it goes in and how many items they answer (None without a
    budget, or before jobs of its kind were billed: ``answer``, their output per call)."""
    out = {"batch_one_part_budget_tokens": sum(strict) + len(strict) * max_tokens,
           "batch_one_part_budget_nusd": None, "batch_parts": None, "batch_items_in_budget": None}
    if price is not None:
        out["batch_one_part_budget_nusd"] = sum(price.nano_usd(s, max_tokens, batch=True) for s in strict)
    rooms: list[Room] = []
    if budget_tokens:
        rooms.append((budget_tokens, lambda i, o: i + o))
    if budget_nusd and price is not None:
        rooms.append((budget_nusd, lambda i, o: price.nano_usd(i, o, batch=True)))
    if rooms and answer is not None and strict:
        out["batch_parts"], out["batch_items_in_budget"] = parts_under(rooms, strict, likely, max_tokens, answer,
                                                                        margin)
    return out
