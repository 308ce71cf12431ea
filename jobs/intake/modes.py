"""Which way a job's items reach the model: ``mode`` ``"direct"`` (each item one call, now;
the default) or ``"batch"`` (the provider's batch API: jobs/batch/run.py). Checked at the
doors, before anything is written: a kind that makes no one call per item, or a backend with no
batch API, is refused with a message naming the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobs.errors import InvalidJob

if TYPE_CHECKING:
    from jobs.models.provider import CallRequest

MODE_FIELD = "mode"
MODES = ("direct", "batch")


@dataclass(frozen=True)
class BatchSpec:
    """How a kind sends its items as a batch (``Kind.batch``): the one call per item, and the
    item's value read from the answer's text (raising ItemError for an item error, NeedsDirect
    to ask the item directly)."""

    request: Callable[[dict, Any, int], CallRequest]  # (payload, item, max tokens) -> the call
    read: Callable[[dict, Any, str], Any]  # (payload, item, answer text) -> the item's value
    #: (backend, payload, item, the batch's answer) -> the item's value, by direct calls that carry
    #: that answer (``read`` raised ``NeedsDirect(answer)``); None: such an item is asked anew.
    repair: Callable[[Any, dict, Any, str], Any] | None = None


def mode_of(payload: dict) -> str:
    return payload.get(MODE_FIELD) or "direct"


def check_mode(payload: dict, kind_name: str, spec: BatchSpec | None,
               backend_problem: Callable[[], str | None]) -> str:
    """The payload's mode; InvalidJob naming the field when the kind cannot, or the backend
    (``backend_problem()``: why it has no batch API, or None) cannot."""
    mode = payload.get(MODE_FIELD, "direct")
    if mode not in MODES:
        raise InvalidJob(f"'{MODE_FIELD}' must be \"direct\" or \"batch\", got {json.dumps(mode)[:60]}")
    if mode == "batch":
        if spec is None:
            raise InvalidJob(f"'{MODE_FIELD}': kind {kind_name!r} does not support batch mode (one model call "
                             "per item: classify, prompt, extract); submit it with mode \"direct\"")
        problem = backend_problem()
        if problem:
            raise InvalidJob(f"'{MODE_FIELD}': {problem}; submit it with mode \"direct\"")
    return mode
