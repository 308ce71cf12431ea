"""How a job ended, as one word every surface shares (the page, the status JSON, the CLI and
its exit code, the lists, /metrics), and the item errors behind two of them.

    succeeded                    every item answered
    succeeded_with_item_errors   ended, some items hold an error instead of an answer (at most
                                 ``max_item_errors`` of them, and not all)
    failed                       its error says why (too many item errors is one reason)
    canceled                     by `leash cancel`, the job page or RQ's cancel
    stopped                      by RQ's stop command (rq-dashboard, ``send_stop_job_command``)

The state machine keeps its four states: the two succeeded outcomes are ``succeeded``, the
last three ``failed``. An item error is an item whose stored result is ``{"error": "..."}``
(what a kind stores for an item the model could not answer), whatever the kind.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

# Imports nothing of leash: every reader of a status (jobs.core.details) leans on it. The texts
# below are the ones jobs.errors.CANCELED and jobs.core.rq_side.ENDED_BY_RQ store (a test holds
# them equal).

SUCCEEDED = "succeeded"
WITH_ITEM_ERRORS = "succeeded_with_item_errors"
FAILED = "failed"
CANCELED_OUTCOME = "canceled"
STOPPED = "stopped"
#: Every outcome of an ended job, in the order lists show them.
ENDED = (SUCCEEDED, WITH_ITEM_ERRORS, FAILED, CANCELED_OUTCOME, STOPPED)

#: The error of a job canceled through leash (jobs.errors.CANCELED).
CANCELED = "canceled"
#: How RQ's own cancel reads in leash (jobs/core/upkeep/consistency.py).
CANCELED_IN_RQ = "canceled in RQ"
#: How RQ's stop command reads in leash (jobs.core.rq_side.ENDED_BY_RQ).
STOPPED_BY_RQ = "stopped by RQ's stop command"

#: The job hash's field holding how many items ended in an error (written as the job ends).
FIELD = "item_errors"


def is_canceled(error: str | None) -> bool:
    return bool(error) and (error == CANCELED or error.startswith(CANCELED_IN_RQ))


def is_stopped(error: str | None) -> bool:
    return bool(error) and error.startswith(STOPPED_BY_RQ)


def is_item_error(value: Any) -> bool:
    """A stored result that is an item's error, not its answer."""
    return isinstance(value, dict) and set(value) == {"error"}


def of(state: str, error: str | None, item_errors: int) -> str | None:
    """The outcome of a job in ``state`` (None while it is queued or running)."""
    if state == "succeeded":
        return WITH_ITEM_ERRORS if item_errors else SUCCEEDED
    if state != "failed":
        return None
    if is_canceled(error):
        return CANCELED_OUTCOME
    return STOPPED if is_stopped(error) else FAILED


def words(fields: dict) -> str:
    """The outcome (or the state) in words: "succeeded with 2 of 5 item errors"."""
    outcome = fields.get("outcome")
    if outcome == WITH_ITEM_ERRORS:
        return f"succeeded with {fields.get('item_errors', 0)} of {fields.get('total', 0)} item errors"
    if outcome == STOPPED:
        return "stopped by RQ's stop command"
    return outcome or fields["state"]


def allowed(limit: tuple[int | None, float | None], total: int) -> int | None:
    """How many item errors a job of ``total`` items may end with (None: any but all)."""
    count_, share = limit
    if count_ is not None:
        return count_
    return None if share is None else int(share * total)


def too_many(errors: int, total: int, limit: tuple[int | None, float | None]) -> bool:
    most = allowed(limit, total)
    return errors > 0 and (errors >= total or (most is not None and errors > most))


def failure_text(errors: Counter, total: int, limit_text: str) -> str:
    """The error of a job failed by its item errors: the count, then the most common one."""
    n = sum(errors.values())
    text, times = errors.most_common(1)[0]
    why = "" if n >= total else f", more than {limit_text} allows"
    return f"{n} of {total} items ended in an error{why}; the most common ({times}): {text}"


#: How ``failure_text`` starts (a test holds the two together).
_FAILED_BY_ITEM_ERRORS = re.compile(r"\d+ of \d+ items ended in an error[,;]")


def failed_by_item_errors(error: str | None) -> bool:
    """The error is ``failure_text``'s: the job failed because too many of its items errored
    (a replay asks those items again: jobs.deadletter.item_errors)."""
    return bool(error) and _FAILED_BY_ITEM_ERRORS.match(error) is not None
