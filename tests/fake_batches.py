"""The batch endpoints of the fake model servers, in the shapes of the providers' published
APIs, so the tests drive them only through the official SDKs:

- OpenAI (``OpenAIBatchAPI``): ``POST /v1/files`` (multipart, purpose ``batch``), ``GET
  /v1/files/{id}`` and ``/content``, ``POST /v1/batches``, ``GET /v1/batches/{id}``, ``POST
  /v1/batches/{id}/cancel``, ``GET /v1/batches`` (newest first, ``after`` / ``limit``);
- Anthropic (``AnthropicBatchAPI``, in ``tests.fake_anthropic``): ``/v1/messages/batches``.

Each request of a batch is answered by the same rules as a direct call (``server.on(item,
behaviour)``, the default reply, the provider's refusals), computed when the batch ends; what
a batch answered is in ``batch_billed``, apart from the direct calls' ``server.billed``.

How a batch moves on (``BatchAPI``): with ``auto`` (the default) each poll of the batch moves it
one step (validating -> in progress -> finalizing -> ended, every ``polls_per_step`` polls), or
after ``seconds_per_step`` each; with ``auto = False`` only the test moves it: ``advance(id)``,
``complete(id)``, ``expire(id, done=k)`` (the first k ran, the rest expired),
``run_first(id, k)`` (before a cancel: the first k ran; a canceled batch ends, those k answered
and billed, the rest canceled, at its next ``advance``), ``fail(custom_ids, status)`` (those
requests answer that HTTP error). ``fail_polls(statuses)``: the next reads of a batch answer
those HTTP errors, one each (with ``retry-after-ms: 1``, so the SDK's own retries go fast),
``fail_results(statuses)`` the same for reads of an ended batch's results; ``forget(id)``: the batch is gone (404). ``created`` counts the batches created.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from tests.fake_openai import Error, Reply, seen_of, send_json

VALIDATING, IN_PROGRESS, FINALIZING, ENDED = range(4)


@dataclass
class FakeBatch:
    id: str
    requests: list[tuple[str, dict]]  # (custom_id, request body) in the order sent
    metadata: dict = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    stage: int = VALIDATING
    ending: str = ""  # completed, expired, cancelled or failed, once ended
    canceling: bool = False
    ran: int = 0  # requests answered before an expiry or a cancel
    polls: int = 0
    times: dict = field(default_factory=dict)  # stage or ending -> when it was reached
    results: dict = field(default_factory=dict)  # custom_id -> (status, body) or None (never ran)
    errors: list = field(default_factory=list)  # why the whole batch was refused


class BatchAPI:
    """The batches of one fake server and how they move on; a subclass speaks one protocol."""

    def __init__(self, server):
        self.server = server
        self.batches: dict[str, FakeBatch] = {}  # in creation order
        self.lock = threading.RLock()
        self.auto = True
        self.polls_per_step = 1
        self.seconds_per_step: float | None = None
        self.failing: dict[str, Error] = {}
        self.poll_errors: list[Error] = []
        self.poll_errors_sent = 0
        self.result_errors: list[Error] = []
        self.result_errors_sent = 0
        self.batch_billed: list[tuple[int, int]] = []

    @property
    def created(self) -> int:
        return len(self.batches)

    # --- test controls --------------------------------------------------------------------

    def batch(self, batch_id: str) -> FakeBatch:
        return self.batches[batch_id]

    def fail(self, custom_ids, status: int = 500, message: str = "the server had an error") -> None:
        for name in custom_ids:
            self.failing[name] = Error(status, message)

    def advance(self, batch_id: str) -> None:
        with self.lock:
            batch = self.batches[batch_id]
            if batch.stage == ENDED:
                return
            if batch.canceling:
                return self._end(batch, "cancelled", batch.ran)
            batch.stage += 1
            batch.times[batch.stage] = time.time()
            if batch.stage == ENDED:
                self._end(batch, "completed", len(batch.requests))

    def complete(self, batch_id: str) -> None:
        with self.lock:
            self._end(self.batches[batch_id], "completed", len(self.batches[batch_id].requests))

    def expire(self, batch_id: str, done: int = 0) -> None:
        with self.lock:
            self._end(self.batches[batch_id], "expired", done)

    def run_first(self, batch_id: str, count: int) -> None:
        with self.lock:
            self.batches[batch_id].ran = count

    def fail_polls(self, statuses: list[int]) -> None:
        with self.lock:
            self.poll_errors += [_quick_error(s) for s in statuses]

    def fail_results(self, statuses: list[int]) -> None:
        with self.lock:
            self.result_errors += [_quick_error(s) for s in statuses]

    def forget(self, batch_id: str) -> None:
        with self.lock:
            del self.batches[batch_id]

    def poll_error(self, handler, results: bool = False) -> bool:
        """Answer a read of a batch (``results``: of its results) with the next error queued
        for it, if any."""
        kind = "result_errors" if results else "poll_errors"
        with self.lock:
            queued = getattr(self, kind)
            if not queued:
                return False
            error = queued.pop(0)
            setattr(self, f"{kind}_sent", getattr(self, f"{kind}_sent") + 1)
        error.respond(self.server, handler, None)
        return True

    def cancel(self, batch_id: str) -> None:
        with self.lock:
            batch = self.batches[batch_id]
            if batch.stage != ENDED:
                batch.canceling = True
                batch.times.setdefault("cancelling", time.time())

    # --- how a batch moves on -------------------------------------------------------------

    def new(self, batch_id: str, requests: list[tuple[str, dict]], metadata: dict | None = None) -> FakeBatch:
        with self.lock:
            batch = FakeBatch(batch_id, requests, metadata or {})
            batch.times[VALIDATING] = batch.created_at
            self.batches[batch_id] = batch
            return batch

    def polled(self, batch: FakeBatch) -> None:
        """A client read the batch: with ``auto``, it moves on."""
        with self.lock:
            batch.polls += 1
            if not self.auto or batch.stage == ENDED:
                return
            if self.seconds_per_step is not None:
                due = int((time.time() - batch.created_at) / self.seconds_per_step) - batch.stage
            else:
                due = 1 if batch.polls % self.polls_per_step == 0 else 0
            for _ in range(max(0, due)):
                self.advance(batch.id)

    def _end(self, batch: FakeBatch, ending: str, ran: int) -> None:
        if batch.stage == ENDED and batch.ending:
            return
        batch.stage, batch.ending, batch.ran = ENDED, ending, ran
        batch.times[ending] = time.time()
        for i, (name, body) in enumerate(batch.requests):
            batch.results[name] = self._answer(name, body) if i < ran and ending != "failed" else None
        self.ended(batch)

    def _answer(self, name: str, body: dict) -> tuple[int, dict]:
        seen = seen_of(body, {}, self.server, time.time())
        behaviour = self.failing.get(name) or self.server.behaviour(seen, direct=False)
        status, answer, usage = getattr(behaviour, "result", Reply().result)(self.server, seen)
        if usage and status == 200:
            self.batch_billed.append(usage)
        return status, answer

    def ended(self, batch: FakeBatch) -> None:
        """What the protocol does when a batch ends (OpenAI writes its files)."""

    def page(self, handler, objects: list[dict], after_param: str) -> None:
        """A list answer, newest first, from the query's cursor on."""
        query = parse_qs(urlsplit(handler.path).query)
        limit = int(query.get("limit", ["20"])[0])
        after = query.get(after_param, [None])[0]
        ids = [o["id"] for o in objects]
        start = ids.index(after) + 1 if after in ids else 0
        data = objects[start:start + limit]
        send_json(handler, 200, {"object": "list", "data": data, "has_more": start + limit < len(objects),
                                 "first_id": data[0]["id"] if data else None,
                                 "last_id": data[-1]["id"] if data else None})

    def route(self, handler, method: str) -> bool:
        raise NotImplementedError


def _quick_error(status: int) -> Error:
    return Error(status, f"the server had an error ({status})", headers={"retry-after-ms": "1"})


def body_of(handler) -> bytes:
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


def send_bytes(handler, data: bytes, content_type: str) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class OpenAIBatchAPI(BatchAPI):
    """OpenAI's Files and Batch APIs (https://platform.openai.com/docs/api-reference/batch)."""

    STATUS = {VALIDATING: "validating", IN_PROGRESS: "in_progress", FINALIZING: "finalizing"}

    def __init__(self, server):
        super().__init__(server)
        self.files: dict[str, dict] = {}

    def route(self, handler, method: str) -> bool:
        path = urlsplit(handler.path).path.rstrip("/")
        if method == "POST" and path == "/v1/files":
            return self._upload(handler)
        if method == "POST" and path == "/v1/batches":
            return self._create(handler)
        if method == "GET" and path == "/v1/batches":
            with self.lock:
                objects = [self.shape(b) for b in reversed(self.batches.values())]
            return self.page(handler, objects, "after") or True
        if match := re.fullmatch(r"/v1/files/([\w-]+)(/content)?", path):
            file = self.files.get(match[1])
            if file is None:
                return send_json(handler, 404, self.server.error_body(Error(404, "No such File object"))) or True
            if match[2]:
                if file["purpose"] == "batch_output" and self.poll_error(handler, results=True):
                    return True
                return send_bytes(handler, file["data"], "application/octet-stream") or True
            return send_json(handler, 200, {k: v for k, v in file.items() if k != "data"}) or True
        if match := re.fullmatch(r"/v1/batches/([\w-]+)(/cancel)?", path):
            batch = self.batches.get(match[1])
            if batch is None:
                return send_json(handler, 404, self.server.error_body(Error(404, "No such Batch object"))) or True
            if match[2] and method == "POST":
                self.cancel(batch.id)
            elif method == "GET":
                if self.poll_error(handler):
                    return True
                self.polled(batch)
            return send_json(handler, 200, self.shape(batch)) or True
        return False

    def _upload(self, handler) -> bool:
        raw = body_of(handler)
        head = f"Content-Type: {handler.headers.get('Content-Type')}\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + raw)
        fields = {part.get_param("name", header="content-disposition"): part for part in message.iter_parts()}
        data = fields["file"].get_payload(decode=True)
        purpose = fields["purpose"].get_payload(decode=True).decode()
        file = self._file(data, fields["file"].get_filename() or "upload.jsonl", purpose)
        return send_json(handler, 200, {k: v for k, v in file.items() if k != "data"}) or True

    def _file(self, data: bytes, filename: str, purpose: str) -> dict:
        file = {"id": f"file-{secrets.token_hex(12)}", "object": "file", "bytes": len(data),
                "created_at": int(time.time()), "filename": filename, "purpose": purpose,
                "status": "processed", "data": data}
        self.files[file["id"]] = file
        return file

    def _create(self, handler) -> bool:
        body = json.loads(body_of(handler))
        file = self.files.get(body.get("input_file_id"))
        if file is None or body.get("completion_window") != "24h":
            error = Error(400, "input_file_id must name an uploaded file; completion_window must be 24h")
            return send_json(handler, 400, self.server.error_body(error)) or True
        requests, errors = [], []
        for number, line in enumerate(file["data"].decode().splitlines(), 1):
            try:
                request = json.loads(line)
            except ValueError:
                errors.append({"code": "invalid_json_line", "message": "not JSON", "line": number, "param": None})
                continue
            if request.get("url") != body["endpoint"] or request.get("method") != "POST":
                errors.append({"code": "invalid_url", "message": f"url must be {body['endpoint']}",
                               "line": number, "param": "url"})
            requests.append((request.get("custom_id"), request.get("body") or {}))
        batch = self.new(f"batch_{secrets.token_hex(12)}", requests, body.get("metadata"))
        batch.endpoint, batch.input_file_id = body["endpoint"], file["id"]
        if errors:
            batch.errors = errors
            with self.lock:
                self._end(batch, "failed", 0)
        return send_json(handler, 200, self.shape(batch)) or True

    def ended(self, batch: FakeBatch) -> None:
        if batch.ending == "failed":
            return
        output, errors = [], []
        for name, result in batch.results.items():
            line = {"id": f"batch_req_{secrets.token_hex(8)}", "custom_id": name, "response": None, "error": None}
            if result is None:
                code = "batch_expired" if batch.ending == "expired" else "batch_cancelled"
                line["error"] = {"code": code, "message": f"This request could not be executed ({code})."}
                errors.append(line)
                continue
            status, body = result
            line["response"] = {"status_code": status, "request_id": secrets.token_hex(8), "body": body}
            (output if status == 200 else errors).append(line)
        for lines, attribute in ((output, "output_file_id"), (errors, "error_file_id")):
            if lines:
                data = "".join(json.dumps(line) + "\n" for line in lines).encode()
                setattr(batch, attribute, self._file(data, f"{batch.id}_{attribute}.jsonl", "batch_output")["id"])

    def shape(self, batch: FakeBatch) -> dict:
        with self.lock:
            status = batch.ending or ("cancelling" if batch.canceling else self.STATUS[batch.stage])
            failed = sum(1 for r in batch.results.values() if r is None or r[0] != 200)
            at = {k: int(v) for k, v in batch.times.items()}
            return {
                "id": batch.id, "object": "batch", "endpoint": getattr(batch, "endpoint", "/v1/chat/completions"),
                "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
                "input_file_id": getattr(batch, "input_file_id", ""), "completion_window": "24h",
                "status": status, "output_file_id": getattr(batch, "output_file_id", None),
                "error_file_id": getattr(batch, "error_file_id", None), "created_at": int(batch.created_at),
                "in_progress_at": at.get(IN_PROGRESS), "expires_at": int(batch.created_at) + 86400,
                "finalizing_at": at.get(FINALIZING), "completed_at": at.get("completed"),
                "failed_at": at.get("failed"), "expired_at": at.get("expired"),
                "cancelling_at": at.get("cancelling"), "cancelled_at": at.get("cancelled"),
                "request_counts": {"total": len(batch.requests), "completed": len(batch.results) - failed,
                                   "failed": failed},
                "metadata": batch.metadata,
            }
