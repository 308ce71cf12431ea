"""`leash status --full` shows a failed job's whole error: the job hash keeps the
LEASH_ERROR_MAX_CHARS cut every status answer carries, the error history keeps the whole text up
to lease.FULL_ERROR_BYTES, and only the terminal without --full cuts it to a line."""

from __future__ import annotations

import json

from jobs import keys
from jobs.core import lease
from jobs.core.details import CUT_MARKER
from tests.test_cli import run, submit

STEPS = "".join(f'\n  File "jobs/step_{n}.py", line {n}, in step_{n}\n    step_{n + 1}(items)' for n in range(80))


def _failed_with(conn, error: str) -> str:
    job_id = submit("x", "y")
    attempt = lease.claim(conn, job_id, "leash", "worker-1")
    attempt.fail(error, permanent=True)
    return job_id


def test_status_full_shows_the_whole_error_the_hash_keeps_a_cut(conn, env):
    error = "PermanentError: the model refused the request\nTraceback (most recent call last):" + STEPS
    assert 4000 < len(error) < lease.FULL_ERROR_BYTES
    job_id = _failed_with(conn, error)
    stored = conn.hget(keys.job(job_id), "error").decode()
    assert len(stored) <= 1000 and CUT_MARKER in stored  # the hash: LEASH_ERROR_MAX_CHARS
    assert json.loads(run("status", job_id, "--json").stdout)["error"] == stored
    whole = run("status", job_id, "--full")
    assert whole.exit_code == 1, whole.output
    for line in error.splitlines()[1:]:
        assert line.strip() in whole.stdout, line  # every step, the middle ones too
    assert "[truncated]" not in whole.stdout
    short = run("status", job_id).stdout
    [error_line] = [line for line in short.splitlines() if line.startswith("error ")]
    assert error_line.endswith("(whole text: --full)") and "step_30" not in short


def test_an_error_over_the_bound_is_kept_to_the_bound(conn, env):
    error = "PermanentError: long\n" + "x" * (3 * lease.FULL_ERROR_BYTES)
    job_id = _failed_with(conn, error)
    [entry] = [json.loads(e) for e in conn.lrange(keys.errors(job_id), 0, -1)]
    kept = entry["error"]
    assert len(json.dumps(kept)) - 2 <= lease.FULL_ERROR_BYTES and CUT_MARKER in kept
    assert kept.startswith("PermanentError: long\n")
    whole = run("status", job_id, "--full").stdout
    assert "x" * 4000 in whole and len(whole) < 2 * lease.FULL_ERROR_BYTES
