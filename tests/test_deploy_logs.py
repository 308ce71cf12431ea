"""Logs machines can read: with LEASH_LOG_FORMAT=json every line the worker (work-horses and
scheduler included) and the web server (waitress's own lines included) print is one JSON
object, carrying the job id, attempt, kind and owner when the line is about a job. Plain
text stays the default."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main
from cli.devserver import free_port
from jobs import enqueue, keys
from jobs.core import states
from jobs.core.lease import Attempt
from jobs.observability import logs
from tests.conftest import ROOT, wait_for

JSON_ENV = {"LEASH_LOG_FORMAT": "json"}


def json_lines(path: Path) -> list[dict]:
    """Every non-empty line of the file, each of which must be one JSON object."""
    parsed = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
        assert isinstance(record, dict) and {"time", "level", "logger", "message"} <= set(record), line
        parsed.append(record)
    return parsed


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, as a deploy does, so the process writes its last lines; SIGKILL its group if it hangs."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.mark.slow
def test_every_worker_line_is_json_and_lines_about_a_job_carry_its_context(conn, env, tmp_path):
    output = tmp_path / "worker.log"
    worker_env = dict(os.environ, **JSON_ENV, PYTHONPATH=str(ROOT))
    with output.open("w") as sink:
        worker = subprocess.Popen([sys.executable, "-m", "cli", "worker", "--log-level", "INFO"], cwd=ROOT,
                                  env=worker_env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        good, _ = enqueue(conn, "count", {"items": ["a", "b"], "delay": 0}, owner="dave")
        bad, _ = enqueue(conn, "permanent", {"items": ["x"]}, owner="erin")
        wait_for(lambda: states.status(conn, good)["state"] == "succeeded"
                 and states.status(conn, bad)["state"] == "failed", 60, message="both jobs to end")
    finally:
        stop(worker)

    lines = json_lines(output)
    loggers = {line["logger"] for line in lines}
    assert {"rq.worker", "rq.scheduler"} <= loggers, loggers  # the scheduler process's lines too
    about_good = [line for line in lines if line.get("job_id") == good]
    assert about_good and all(line["attempt"] == 1 and line["owner"] == "dave" and line["kind"] == "count"
                              for line in about_good)
    failure = [line for line in lines if line.get("job_id") == bad and line["level"] == "ERROR"]
    assert failure and failure[0]["owner"] == "erin" and "PermanentError: the model rejected" in failure[0]["message"]
    assert "arguments" not in failure[0]  # RQ's copy of the payload stays out of the logs
    assert any("job_id" not in line for line in lines)  # lines about no job carry no job fields


@pytest.mark.slow
def test_every_web_line_is_json_including_the_servers_and_a_request_about_a_job_names_it(conn, tmp_path):
    output = tmp_path / "web.log"
    port = free_port()
    unreachable_redis = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: the job read is a 503
    web_env = dict(os.environ, **JSON_ENV, PYTHONPATH=str(ROOT), SECRET_KEY="s", REDIS_URL=unreachable_redis)
    web_env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with output.open("w") as sink:
        web = subprocess.Popen(
            [sys.executable, "-m", "cli", "web", "--host", "127.0.0.1", "--port", str(port)], cwd=ROOT, env=web_env, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        def job_read_status() -> int | None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/jobs/job-42", timeout=5)
            except urllib.error.HTTPError as exc:
                return exc.code
            except OSError:
                return None
            return 200

        assert wait_for(job_read_status, 30, interval=0.2, message="the web server to answer") == 503
    finally:
        stop(web)

    lines = json_lines(output)
    assert any(line["logger"] == "waitress" and "Serving on" in line["message"] for line in lines)
    about_job = [line for line in lines if line.get("job_id") == "job-42"]
    assert about_job and about_job[0]["owner"] == "shared" and about_job[0]["level"] == "WARNING"


def test_plain_text_is_the_default():
    os.environ.pop("LEASH_LOG_FORMAT", None)
    assert logs.log_format() == "text"
    stream = io.StringIO()
    logger = _logger_writing_to(logs.make_handler(logs.log_format(), stream))
    logger.warning("hello %s", "there")
    line = stream.getvalue().strip()
    assert line.endswith("leash.test.format WARNING hello there")
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_a_json_line_written_during_an_attempt_names_job_attempt_kind_and_owner(conn):
    job_id, _ = enqueue(conn, "count", {"items": ["a"]}, owner="frank")
    stream = io.StringIO()
    logger = _logger_writing_to(logs.make_handler("json", stream))
    running = {"attempt": Attempt(conn, job_id, token="1", number=2, queue="leash", lease_seconds=5, kind="count")}
    logs.add_context_provider(lambda: logs.attempt_context(running["attempt"]))  # as a worker does
    try:
        logger.info("working")
    finally:
        running["attempt"] = None
    logger.info("idle")
    working, idle = (json.loads(line) for line in stream.getvalue().splitlines())
    assert working["message"] == "working" and working["level"] == "INFO"
    assert (working["job_id"], working["attempt"], working["kind"], working["owner"]) == (job_id, 2, "count", "frank")
    assert not set(logs.CONTEXT_FIELDS) & set(idle)
    assert conn.hget(keys.job(job_id), "owner") == b"frank"


def test_an_unknown_log_format_is_a_usage_error(env):
    result = CliRunner().invoke(main, ["worker"], env={"LEASH_LOG_FORMAT": "xml"})
    assert result.exit_code == 2
    assert "LEASH_LOG_FORMAT must be one of text, json, got 'xml'" in result.output


def _logger_writing_to(handler: logging.Handler) -> logging.Logger:
    logger = logging.getLogger("leash.test.format")
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def test_rqs_errors_about_an_unreachable_redis_are_warnings_and_real_errors_stay_errors():
    """A Redis blip the worker rides out is not an error (an alert on ERROR must not fire on
    every failover); the line says for how long so far. Anything else RQ logs at ERROR stays."""
    import redis

    from jobs.worker.log import RiddenOut

    now = [100.0]
    ridden = RiddenOut(clock=lambda: now[0])

    def record(msg, args=(), exc=None):
        rec = logging.LogRecord("rq.worker", logging.ERROR, __file__, 1, msg, args,
                                (type(exc), exc, None) if exc else None)
        assert ridden.filter(rec)
        return rec

    first = record("Worker %s: could not connect to Redis instance: %s retrying in %d seconds...", ("w", "refused", 2))
    now[0] = 112.0
    later = record("Worker %s: could not connect to Redis instance: %s retrying in %d seconds...", ("w", "refused", 4))
    assert (first.levelname, later.levelname) == ("WARNING", "WARNING")
    assert "unreachable for 12 s so far" in later.getMessage()
    raised = record("Scheduler raised an exception.", exc=redis.exceptions.ConnectionError("closed"))
    assert raised.levelno == logging.WARNING
    real = record("job %s: exception raised while executing", ("x",), exc=ValueError("boom"))
    assert real.levelno == logging.ERROR and real.levelname == "ERROR"
