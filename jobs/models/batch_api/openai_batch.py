"""The OpenAI backend's batch side: OpenAI's Batch API (``/v1/files`` + ``/v1/batches``) through
the official ``openai`` SDK, at ``LEASH_MODEL_URL`` like direct calls. The interface is
``jobs.models.batch_api.batching``'s; this is only what is OpenAI's:

- the input is a JSONL file (purpose ``batch``) of ``{"custom_id", "method": "POST", "url":
  "/v1/chat/completions", "body"}``, ``body`` being exactly the direct call's request
  (``OpenAIBackend._body``); a batch holds at most 50,000 requests and 200 MB;
- the batch's ``metadata`` names the job, attempt and part (``leash_job``, ``leash_attempt``,
  ``leash_part``): ``batch_find`` lists batches newest first, down to ``since``, and returns
  those whose metadata match -- exact, whatever else the account runs;
- status ``validating`` -> ``in_progress`` -> ``finalizing`` -> ``completed``, or ``failed``
  (the input was refused: ``BatchProgress.message`` says why), ``expired``, ``cancelling`` ->
  ``cancelled``;
- results are the output file (answered requests, read by ``_read``) then the error file
  (requests answered with an HTTP error, mapped by ``_failure``; ``batch_expired`` and
  ``batch_cancelled`` lines are ``Failure(NOT_RUN)``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

from openai.types.chat import ChatCompletion

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
from jobs.models.provider import UNAVAILABLE, Answer, CallRequest, Failure, Usage

ENDPOINT = "/v1/chat/completions"
ENDED = {"completed", "failed", "expired", "cancelled"}
#: Error codes of requests the batch never ran.
NOT_RUN_CODES = {"batch_expired", "batch_cancelled"}
#: How far back (seconds) before ``since`` a batch is still looked at: clocks differ a little.
CLOCK_SLACK = 300


class OpenAIBatches(BatchSide):
    """Mixed into ``OpenAIBackend``: uses its ``client``, ``settings``, ``_body``, ``_read`` and
    ``_failure``."""

    batch_limits = BatchLimits(max_requests=50_000, max_bytes=200 * 1024 * 1024)

    def _batch_line(self, item: Item) -> dict:
        name, request = item
        return {"custom_id": name, "method": "POST", "url": ENDPOINT, "body": self._body(request)}

    def batch_create(self, job_id: str, attempt: int, part: int, items: list[Item]) -> str:
        check_items(items, self.batch_limits, self._line_size)
        data = "".join(json.dumps(self._batch_line(item), separators=(",", ":")) + "\n" for item in items)
        client = self._batch_sdk
        name = f"leash-{job_id}-{attempt}-{part}.jsonl"
        upload = client.files.create(file=(name, data.encode(), "application/jsonl"), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint=ENDPOINT, completion_window="24h",
                                      metadata=_metadata(job_id, attempt, part))
        return batch.id

    def batch_find(self, job_id: str, attempt: int, part: int, since: float, custom_ids=()) -> list[str]:
        wanted = _metadata(job_id, attempt, part)
        found = []
        for batch in self._batch_sdk.batches.list(limit=100):  # newest first; pages on demand
            if batch.created_at < since - CLOCK_SLACK:
                break
            if all((batch.metadata or {}).get(k) == v for k, v in wanted.items()):
                found.append(batch.id)
        return found

    def batch_confirm(self, batch_id: str, custom_ids) -> bool | None:
        """Always True: a batch ``batch_find`` returns is matched by its metadata already."""
        return True

    def batch_poll(self, batch_id: str) -> BatchProgress:
        batch = self._batch_sdk.batches.retrieve(batch_id)
        counts = batch.request_counts
        errors = batch.errors.data if batch.errors and batch.errors.data else []
        message = "; ".join(f"{e.code}: {e.message}" + (f" (line {e.line})" if e.line else "") for e in errors)
        return BatchProgress(ended=batch.status in ENDED, status=batch.status,
                             done=counts.completed if counts else 0, failed=counts.failed if counts else 0,
                             total=counts.total if counts else 0,
                             expires_at=float(batch.expires_at) if batch.expires_at else None,
                             message=message or None, canceling=batch.status == "cancelling")

    def batch_results(self, batch_id: str, requests: dict[str, CallRequest] | None = None
                      ) -> Iterator[tuple[str, Answer | Failure, Usage | None]]:
        client = self._batch_sdk
        batch = client.batches.retrieve(batch_id)
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            with client.files.with_streaming_response.content(file_id) as content:
                for line in content.iter_lines():
                    if line.strip():
                        yield self._batch_result(json.loads(line), requests or {})

    def batch_cancel(self, batch_id: str) -> None:
        self._batch_sdk.batches.cancel(batch_id)

    def _batch_result(self, line: dict, requests: dict) -> tuple[str, Answer | Failure, Usage | None]:
        name = line.get("custom_id", "")
        response, error = line.get("response"), line.get("error")
        if response and response.get("status_code") == 200:
            answer = self._read(ChatCompletion.model_validate(response["body"]), requests.get(name, unknown_request()))
            usage = replace(answer.usage, batch=True)
            return name, replace(answer, usage=usage), usage
        if response:
            exc = sdk_status_error(self.client, response["status_code"], response.get("body"), "/chat/completions")
            return name, self._failure(exc), None
        code, message = (error or {}).get("code"), (error or {}).get("message") or "no answer"
        if code in NOT_RUN_CODES:
            return name, Failure(NOT_RUN, f"the batch ended before this request ran ({code})"), None
        return name, Failure(UNAVAILABLE, f"the batch could not run this request ({code}): {message}"), None


def _metadata(job_id: str, attempt: int, part: int) -> dict[str, str]:
    return {"leash_job": job_id, "leash_attempt": str(attempt), "leash_part": str(part)}
