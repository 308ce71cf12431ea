"""The Anthropic backend's batch side: Anthropic's Message Batches API
(``/v1/messages/batches``) through the official ``anthropic`` SDK, at ``LEASH_MODEL_URL`` like
direct calls. The interface is ``jobs.models.batch_api.batching``'s; this is only what is Anthropic's:

- a batch is ``requests: [{custom_id, params}]``, ``params`` being exactly the direct call's
  request (``AnthropicBackend._params``); at most 100,000 requests and 256 MB;
- ``processing_status`` ``in_progress`` -> (``canceling``) -> ``ended``; the request counts
  (succeeded, errored, canceled, expired) are final once it has ended, so ``done`` until then is
  the requests no longer processing;
- results (JSONL at ``results_url``, once ended): ``succeeded`` reads with ``_read``,
  ``errored`` maps its error type back to its HTTP status (Anthropic's documented pairs) and then
  through ``_failure`` like a direct error, ``canceled`` and ``expired`` are ``Failure(NOT_RUN)``.

**How ``batch_find`` recognises a batch.** Anthropic's batches carry no metadata, so a batch is
a *candidate* for (job, attempt, part) when it was created at or after ``since`` (the time the
job recorded before creating, less a few minutes for clock differences) and holds exactly as many
requests as the part. A candidate that has ended is *confirmed* by reading its results: its
custom_ids must be exactly the part's (they name the job and its items); one that does not match
is dropped. A candidate still processing cannot be read yet and is returned unconfirmed. The
limit: until it ends, a batch of the same size created in the same window by someone else on the
same account (another job's part of the same size) is indistinguishable, and both are returned;
``batch_confirm(batch_id, custom_ids)`` answers True / False once a candidate has ended (None
before), so the caller can keep the one that is its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from jobs.models.batch_api.batching import (
    NOT_RUN,
    BatchLimits,
    BatchProgress,
    BatchSide,
    Item,
    check_items,
    sdk_status_error,
    unknown_request,
)
from jobs.models.provider import Answer, CallRequest, Failure, Usage

#: The HTTP status of each error type (https://docs.anthropic.com/en/api/errors): an errored
#: batch result names only its type.
STATUS_OF_ERROR_TYPE = {"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
                        "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
                        "rate_limit_error": 429, "api_error": 500, "timeout_error": 504,
                        "overloaded_error": 529}
#: How far back (seconds) before ``since`` a batch is still a candidate: clocks differ a little.
CLOCK_SLACK = 300


class AnthropicBatches(BatchSide):
    """Mixed into ``AnthropicBackend``: uses its ``client``, ``_params``, ``_read`` and
    ``_failure``."""

    batch_limits = BatchLimits(max_requests=100_000, max_bytes=256 * 1024 * 1024)

    @property
    def _batches(self):
        return self._batch_sdk.messages.batches

    def _batch_line(self, item: Item) -> dict:
        name, request = item
        return {"custom_id": name, "params": self._params(request)}

    def batch_create(self, job_id: str, attempt: int, part: int, items: list[Item]) -> str:
        check_items(items, self.batch_limits, self._line_size)
        return self._batches.create(requests=[self._batch_line(item) for item in items]).id

    def batch_find(self, job_id: str, attempt: int, part: int, since: float, custom_ids=()) -> list[str]:
        wanted = set(custom_ids)
        if not wanted:
            raise ValueError("Anthropic's batches are found by their requests: pass the part's custom_ids")
        found = []
        for batch in self._batches.list(limit=100):  # newest first; pages on demand
            if batch.created_at.timestamp() < since - CLOCK_SLACK:
                break
            if _total(batch.request_counts) == len(wanted) and self._confirm(batch, wanted) is not False:
                found.append(batch.id)
        return found

    def batch_confirm(self, batch_id: str, custom_ids) -> bool | None:
        """True when the batch's requests are exactly ``custom_ids``, False when not, None while
        its results cannot be read yet."""
        return self._confirm(self._batches.retrieve(batch_id), set(custom_ids))

    def _confirm(self, batch, wanted: set[str]) -> bool | None:
        if batch.processing_status != "ended":
            return None
        return {result.custom_id for result in self._batches.results(batch.id)} == wanted

    def batch_poll(self, batch_id: str) -> BatchProgress:
        batch = self._batches.retrieve(batch_id)
        counts = batch.request_counts
        ended = batch.processing_status == "ended"
        total = _total(counts)
        failed = counts.errored + counts.canceled + counts.expired
        return BatchProgress(ended=ended, status=batch.processing_status,
                             done=counts.succeeded if ended else total - counts.processing,
                             failed=failed, total=total, expires_at=batch.expires_at.timestamp(),
                             canceling=batch.processing_status == "canceling")

    def batch_results(self, batch_id: str, requests: dict[str, CallRequest] | None = None
                      ) -> Iterator[tuple[str, Answer | Failure, Usage | None]]:
        for line in self._batches.results(batch_id):
            yield self._batch_result(line, requests or {})

    def batch_cancel(self, batch_id: str) -> None:
        self._batches.cancel(batch_id)

    def _batch_result(self, line, requests: dict) -> tuple[str, Answer | Failure, Usage | None]:
        name, result = line.custom_id, line.result
        if result.type == "succeeded":
            answer = self._read(result.message, requests.get(name, unknown_request()))
            usage = replace(answer.usage, batch=True)
            return name, replace(answer, usage=usage), usage
        if result.type == "errored":
            error = result.error.error
            body = {"type": "error", "error": {"type": error.type, "message": error.message}}
            status = STATUS_OF_ERROR_TYPE.get(error.type, 500)
            exc = sdk_status_error(self.client, status, body, "/v1/messages")
            return name, self._failure(exc), None
        return name, Failure(NOT_RUN, f"the batch ended before this request ran ({result.type})"), None


def _total(counts) -> int:
    return counts.processing + counts.succeeded + counts.errored + counts.canceled + counts.expired
