"""`leash dev`'s terminal: the banner names the model backend and its server, and a job prints
one line per event (queued, running, succeeded), never one per model call: a 200-item job
against a model server prints at most one line per 20 calls. `-v` prints every log line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_for
from tests.fake_openai import MODEL
from tests.test_dev import _healthy, free_port, get_json

pytestmark = pytest.mark.slow

ITEMS = 200
OFF_LABEL = 20


def _run_dev(tmp_path: Path, server, *flags: str):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "LEASH_"))}
    env.update({k: v for k, v in os.environ.items() if k.startswith("LEASH_MODEL_")},
               PYTHONPATH=str(ROOT), XDG_STATE_HOME=str(tmp_path / "state"), LEASH_ITEM_CONCURRENCY="8")
    out = open(tmp_path / f"dev{'-v' if flags else ''}.txt", "w")  # noqa: SIM115 - closed below
    dev = subprocess.Popen([sys.executable, "-m", "cli", "dev", "--port", str(port), *flags], cwd=tmp_path,
                           env=env, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for(lambda: _healthy(port), 60, interval=0.2, message="leash dev's web app to answer")
        status, body = get_json(f"http://127.0.0.1:{port}/jobs", {
            "kind": "classify", "name": "two hundred", "labels": ["positive", "negative"],
            "items": [f"review number {i} -> positive" for i in range(ITEMS)]})  # the stand-in answers a label
        assert status == 202
        ended = wait_for(lambda: get_json(f"http://127.0.0.1:{port}/jobs/{body['job_id']}")[1]["state"] in
                         ("succeeded", "failed"), 120, interval=0.3, message="the job to end on the dev worker")
        assert ended and get_json(f"http://127.0.0.1:{port}/jobs/{body['job_id']}")[1]["outcome"] == "succeeded"
        wait_for(lambda: "succeeded" in (tmp_path / out.name).read_text(), 10, interval=0.2,
                 message="the job's last event to be printed")
        first_job_lines = len((tmp_path / out.name).read_text().splitlines())
        # A job whose every item errors (the stand-in answers off the labels) fails with
        # TooManyItemErrors: RQ's ERROR line about it is one line too, never its traceback.
        status, failing = get_json(f"http://127.0.0.1:{port}/jobs", {
            "kind": "classify", "name": "off label", "labels": ["positive", "negative"],
            "items": [f"review {i} -> neutral" for i in range(OFF_LABEL)]})
        assert status == 202
        wait_for(lambda: get_json(f"http://127.0.0.1:{port}/jobs/{failing['job_id']}")[1]["state"] == "failed", 120,
                 interval=0.3, message="the all-off-label job to fail on the dev worker")
        wait_for(lambda: "exception raised while executing" in (tmp_path / out.name).read_text(), 10,
                 interval=0.2, message="RQ's line about the failed job to be printed")
    finally:
        os.killpg(dev.pid, signal.SIGINT)
        try:
            dev.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(dev.pid, signal.SIGKILL)
            dev.wait(timeout=10)
        out.close()
    lines = (tmp_path / out.name).read_text().splitlines()
    return lines[:first_job_lines], lines[first_job_lines:], body["job_id"]


def test_a_200_item_job_prints_one_line_per_event_not_per_call(tmp_path, model_server):
    lines, after, job_id = _run_dev(tmp_path, model_server)
    assert len(model_server.requests) >= ITEMS, "the items were model calls"
    [at] = [n for n, line in enumerate(lines) if "leash is running at" in line]
    assert f"model: {MODEL} via openai at {model_server.url}" in lines[at + 1]
    during = [line for line in lines[at + 3:] if line != "leash stopped"]
    assert len(during) <= ITEMS // 20, "\n".join(during)
    events = [line for line in during if f"job {job_id[:10]} (two hundred)" in line]
    # Its first line: queued, or already running when the once-a-second feed first saw it.
    assert any("queued: 200 classify items" in e or "running, attempt 1" in e for e in events), during
    assert any("succeeded: 200 of 200 items" in e for e in events), during
    # The failed job: RQ's ERROR about it is one line ending with the error, no traceback.
    assert not any("Traceback" in line or line.startswith("  File ") for line in after), "\n".join(after)
    [rq_line] = [line for line in after if "exception raised while executing" in line]
    assert f"{OFF_LABEL} of {OFF_LABEL} items ended in an error" in rq_line, rq_line
