"""What an accepted request costs in Redis is bounded: run the largest requests the limits allow
on a worker (in the test's process), then measure the job's hash, its status answer and everything Redis holds.

Run with ``-s`` to see the figures (they are in docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
import random

import pytest

from jobs import keys
from jobs.config import limits
from jobs.enqueue import enqueue
from jobs.intake.limits import json_size
from tests.conftest import wait_for
from tests.web_support import create_app_with

pytestmark = pytest.mark.slow

LONGEST_OWNER = "o" * 200
HASH_LIMIT = 2048
STATUS_LIMIT = 4096
GROWTH_LIMIT = 10


def _words(rng: random.Random, chars: int) -> str:
    """Random lowercase words: text that compresses about as well as real reviews do."""
    out: list[str] = []
    length = 0
    while length < chars:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:chars]


def _widest_labels() -> list[str]:
    """As many labels as allowed, as long as allowed, with characters JSON escapes, short of the
    summary budget: the largest summary an accepted classify job can produce."""
    limit = limits()
    labels = [f"{i:02d}" + "x" * (limit.max_label_chars - 2) for i in range(limit.max_labels)]
    position = 2
    while True:
        wider = [label[:position] + '"' + label[position + 1:] for label in labels]
        worst = {"items": limit.max_items, "labels": dict.fromkeys(wider, limit.max_items), "errors": limit.max_items}
        if json_size(worst) > limit.max_summary_bytes or position >= limit.max_label_chars:
            return labels
        labels, position = wider, position + 1


def _largest_body(kind_fields: dict, rng: random.Random) -> bytes:
    """max_items items, as long as the payload limit allows."""
    limit = limits()
    frame = json.dumps({**kind_fields, "items": [""] * limit.max_items})
    per_item = min(limit.max_item_chars, (limit.max_payload_bytes - len(frame) - 100) // limit.max_items)
    body = json.dumps({**kind_fields, "items": [_words(rng, per_item) for _ in range(limit.max_items)]})
    assert len(body) <= limit.max_payload_bytes
    return body.encode()


def _hash_bytes(conn, job_id: str) -> int:
    return sum(len(k) + len(v) for k, v in conn.hgetall(keys.job(job_id)).items())


def _stored_bytes(conn) -> int:
    """MEMORY USAGE of every key in the test database: what the requests left behind."""
    return sum(conn.memory_usage(key, samples=0) or 0 for key in conn.scan_iter(count=1000))


def _wait_ended(conn, job_id: str, timeout: float = 90) -> str:
    def ended():
        state = conn.hget(keys.job(job_id), "state")
        return state.decode() if state in (b"succeeded", b"failed") else None

    return wait_for(ended, timeout, interval=0.2, message=f"job {job_id} to end")


@pytest.fixture
def long_owner_client(conn):
    token = "t" * 32
    return create_app_with(LEASH_API_TOKENS=f"{LONGEST_OWNER}={token}").test_client(), {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("kind_fields", [
    {"kind": "classify", "labels": _widest_labels()},
    {"kind": "prompt", "template": "{item}" + "t" * (limits().max_template_chars - 6)},
], ids=["classify", "prompt"])
def test_the_largest_allowed_request_stays_small_in_redis_and_in_every_answer(conn, burst, long_owner_client,
                                                                             kind_fields):
    client, auth = long_owner_client
    body = _largest_body(kind_fields, random.Random(11))
    before = _stored_bytes(conn)
    response = client.post("/jobs", data=body, headers={"Content-Type": "application/json", **auth})
    assert response.status_code == 202, response.get_json()
    job_id = response.get_json()["job_id"]
    burst()
    assert _wait_ended(conn, job_id) == "succeeded"

    status = client.get(f"/jobs/{job_id}", headers=auth)
    listing = client.get("/jobs?limit=20", headers=auth)
    summary = status.get_json()["result"]["summary"]
    stored = _stored_bytes(conn) - before
    figures = {"request bytes": len(body), "job hash bytes": _hash_bytes(conn, job_id),
               "job hash MEMORY USAGE": conn.memory_usage(keys.job(job_id), samples=0),
               "status answer bytes": len(status.data), "summary bytes": json_size(summary),
               "GET /jobs?limit=20 bytes": len(listing.data), "Redis bytes stored": stored,
               "stored / request": round(stored / len(body), 2)}
    print(f"\n{kind_fields['kind']} at the limits: {figures}\n  hash fields: {sorted(k.decode() for k in conn.hkeys(keys.job(job_id)))}")
    assert figures["job hash bytes"] < HASH_LIMIT
    # Redis's own bookkeeping (a hashtable once a value passes 64 bytes) comes on top.
    assert figures["job hash MEMORY USAGE"] < HASH_LIMIT + 1024
    assert figures["status answer bytes"] < STATUS_LIMIT
    assert stored <= GROWTH_LIMIT * len(body)
    if kind_fields["kind"] == "classify":
        assert len(summary["labels"]) == limits().max_labels  # every label was counted: the widest summary


def test_a_failed_jobs_hash_and_status_stay_small_whatever_its_error_says(conn, burst):
    job_id, _ = enqueue(conn, "long_error", {}, owner=LONGEST_OWNER)
    burst()
    assert _wait_ended(conn, job_id) == "failed"
    client = create_app_with(LEASH_API_TOKENS=f"{LONGEST_OWNER}={'t' * 32}").test_client()
    status = client.get(f"/jobs/{job_id}", headers={"Authorization": f"Bearer {'t' * 32}"})
    error = status.get_json()["error"]
    assert error.startswith("PermanentError: \U0001F600") and "xxxxxxxx" in error and "[truncated]" in error
    print(f"\nfailed job: hash {_hash_bytes(conn, job_id)} bytes, status answer {len(status.data)} bytes")
    assert _hash_bytes(conn, job_id) < HASH_LIMIT
    assert len(status.data) < STATUS_LIMIT


def test_a_summary_that_grows_with_the_input_is_not_stored_and_the_job_still_succeeds(conn, burst):
    # Limits apply at the door: a job whose calls were made is not failed by one at its end.
    job_id, _ = enqueue(conn, "big_summary", {"text": "y" * 100}, max_attempts=3)
    burst()
    assert _wait_ended(conn, job_id) == "succeeded"
    raw = conn.hgetall(keys.job(job_id))
    size = len(json.dumps({"echo": "y" * 10_000}, separators=(",", ":")))
    assert json.loads(raw[b"result"]) == {"summary_omitted": f"{size} bytes as JSON, over LEASH_MAX_SUMMARY_BYTES"}
    assert raw[b"attempts"] == b"1" and _hash_bytes(conn, job_id) < HASH_LIMIT
