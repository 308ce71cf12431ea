"""What every provider's batch API shares: a job's calls sent as one batch the provider runs
within a day, at half the price of direct calls (OpenAI's Batch API, Anthropic's Message Batches).

A backend that supports batches (``supports_batch`` True) offers, besides ``classify`` and
``complete``::

    batch_limits                                    BatchLimits(max_requests, max_bytes) per batch
    batch_split(items) -> list[list[item]]          items cut into parts that fit batch_limits
    batch_create(job_id, attempt, part, items) -> batch id
    batch_find(job_id, attempt, part, since, custom_ids) -> [batch id]
                                                    what this job, attempt and part already created
    batch_confirm(batch_id, custom_ids) -> bool | None
                                                    a found batch is this part's (None: not yet known)
    batch_poll(batch_id) -> BatchProgress           ended?, the provider's status, counts, expiry
    batch_results(batch_id, requests=None)          -> iterator of (custom_id, Answer | Failure,
                                                    Usage | None)
    batch_cancel(batch_id)
    record_usage(usage)                             a result's usage counted on the current item

Results are final once ``batch_poll`` says ``ended``. An item is ``(custom_id, CallRequest)``;
``custom_id(job_id, index)`` names the job and the item in the characters every provider
accepts (Anthropic's ``^[a-zA-Z0-9_-]{1,64}$``). A batch line's
body is exactly what a direct call would send (the backend's one request builder), and a result
reads with the same code as a direct answer: a per-request 429 or 5xx is a retryable Failure, a
4xx a PERMANENT one, a cut-off answer an Answer that is CUT_OFF. A request the provider never ran
(the batch expired or was canceled first) is ``Failure(NOT_RUN)``: retryable, e.g. as a direct
call. Usage read from a batch has ``batch=True``, priced at the provider's batch discount
(``jobs.usage.prices``).

A look at a batch (``batch_poll``, ``batch_results``) that raises the SDK's error after the SDK's
own retries is judged by ``look_failure(exc)``: ``LOOK_AGAIN`` for what passes (connection error,
timeout, 429, 5xx: the job looks again next time), ``BATCH_GONE`` for a 404 (the provider has no
such batch), ``PERMANENT`` for any other refusal (401, 403...); None for what is not the
provider's answer at all.

``batch_find`` exists because a worker can die between the provider's create call and the
checkpoint that records the batch id: the next attempt asks before creating, so no second batch
is paid for. OpenAI's batches carry ``metadata`` (job, attempt, part) and are matched exactly;
Anthropic's carry none -- see ``anthropic_batch`` for its rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from jobs.models.provider import PERMANENT, CallRequest

#: A result for a request the provider never ran (batch expired or canceled first): retryable.
NOT_RUN = "not run"
#: The SDK's own retries for the batch endpoints' transient errors (a create retried carries
#: the SDK's idempotency key; batch_find covers a create whose answer was lost).
BATCH_SDK_RETRIES = 3

#: What ``look_failure`` says of an error while looking at a batch (or PERMANENT).
LOOK_AGAIN, BATCH_GONE = "look again", "batch gone"

_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

Item = tuple[str, CallRequest]


@dataclass(frozen=True)
class BatchLimits:
    max_requests: int
    max_bytes: int


@dataclass(frozen=True)
class BatchProgress:
    """Where a batch is. ``ended``: results are final (completed, failed, expired or canceled);
    ``status`` the provider's own word; ``done`` requests answered, ``failed`` those that
    errored, expired or were canceled, of ``total``; ``expires_at`` Unix seconds (None: not said);
    ``message`` why the provider refused the whole batch, if it did; ``canceling`` a cancel has
    reached it and it has not ended yet."""

    ended: bool
    status: str
    done: int
    failed: int
    total: int
    expires_at: float | None = None
    message: str | None = None
    canceling: bool = False


def custom_id(job_id: str, index: int) -> str:
    """The custom_id of item ``index`` of ``job_id``: ``<job id>-<index>``."""
    name = f"{job_id}-{index}"
    if not _CUSTOM_ID.match(name):
        raise ValueError(f"custom_id {name!r} is not 1-64 letters, digits, '_' or '-'")
    return name


def item_index(name: str) -> int:
    """The item index a ``custom_id`` names."""
    return int(name.rsplit("-", 1)[1])


def check_items(items: list[Item], limits: BatchLimits, line_size) -> None:
    """ValueError unless ``items`` fit one batch: custom_ids valid and unique, within limits."""
    if not items:
        raise ValueError("a batch needs at least one request")
    names = [name for name, _ in items]
    bad = [name for name in names if not _CUSTOM_ID.match(name)]
    if bad:
        raise ValueError(f"custom_id {bad[0]!r} is not 1-64 letters, digits, '_' or '-'")
    if len(set(names)) != len(names):
        raise ValueError("custom_ids in a batch must be unique")
    if len(items) > limits.max_requests:
        raise ValueError(f"{len(items)} requests exceed the batch limit of {limits.max_requests}")
    size = sum(line_size(item) for item in items)
    if size > limits.max_bytes:
        raise ValueError(f"{size} bytes exceed the batch limit of {limits.max_bytes}")


def split_items(items: Iterable[Item], limits: BatchLimits, line_size) -> list[list[Item]]:
    """``items`` in order, cut into parts of at most ``limits`` requests and bytes; a single
    request larger than the byte limit is a ValueError (no batch can take it)."""
    parts: list[list[Item]] = []
    part: list[Item] = []
    size = 0
    for item in items:
        line = line_size(item)
        if line > limits.max_bytes:
            raise ValueError(f"request {item[0]!r} alone ({line} bytes) exceeds the batch limit of {limits.max_bytes}")
        if part and (len(part) >= limits.max_requests or size + line > limits.max_bytes):
            parts.append(part)
            part, size = [], 0
        part.append(item)
        size += line
    if part:
        parts.append(part)
    return parts


def json_size(value) -> int:
    """Bytes of ``value`` as one JSONL line (its newline included)."""
    return len(json.dumps(value, separators=(",", ":")).encode()) + 1


def sdk_status_error(client, status: int, body, path: str):
    """The exception the provider's SDK raises for an HTTP ``status`` answer with ``body`` to a
    request to ``path`` under its base URL, so a batch's per-request error is mapped by the
    backend's own ``_failure`` like a direct one."""
    import httpx2  # the HTTP client both SDKs are built on

    url = str(client.base_url).rstrip("/") + path
    response = httpx2.Response(status, json=body, request=httpx2.Request("POST", url))
    return client._make_status_error_from_response(response)  # the SDK's reading of an error answer


class BatchSide:
    """What both providers' batch sides share. A subclass (mixed into its backend, which has the
    SDK ``client``) gives ``batch_limits`` and ``_batch_line(item)``: one request as its batch
    takes it."""

    supports_batch = True
    batch_limits: BatchLimits

    @property
    def _batch_sdk(self):
        # The direct client sends once (the queue retries calls); batch endpoints are plain
        # HTTP resources, retried by the SDK on transient errors.
        return self.client.with_options(max_retries=BATCH_SDK_RETRIES)

    def _batch_line(self, item: Item) -> dict:
        raise NotImplementedError

    def _line_size(self, item: Item) -> int:
        return json_size(self._batch_line(item))

    def batch_split(self, items: list[Item]) -> list[list[Item]]:
        return split_items(items, self.batch_limits, self._line_size)

    def look_failure(self, exc: Exception) -> tuple[str, str] | None:
        """(LOOK_AGAIN, BATCH_GONE or PERMANENT, what happened) for an SDK error raised while
        looking at a batch, read by the backend's ``_failure`` as a direct call's error is; None
        when ``exc`` is not the provider's answer (a bug, leash's own exceptions)."""
        failure = self._failure(exc)
        if failure is None:
            return None
        status = getattr(exc, "status_code", None)
        if status == 404:
            return BATCH_GONE, f"the provider has no such batch (404): {_message(exc)}"
        if failure.kind == PERMANENT:
            return PERMANENT, failure.message
        return LOOK_AGAIN, failure.message or f"{type(exc).__name__}: {_message(exc)}"


def _message(exc: Exception) -> str:
    """The provider's own words (OpenAI's SDK keeps the error object as the body, Anthropic's
    the whole answer)."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body["error"] if isinstance(body.get("error"), dict) else body
        if error.get("message"):
            return str(error["message"])[:300]
    return str(exc)[:300]


def unknown_request() -> CallRequest:
    """Stands in for a result's request when the caller did not pass it (only usage estimates,
    for a server reporting none, read it)."""
    return CallRequest([], 0)

