"""Every leash command finds the Redis `leash dev` runs, and says which Redis when it cannot."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from cli import main
from cli.connection import record_path, remove_record, write_record
from cli.devserver import free_port
from tests.conftest import REDIS_URL


def run(*args):
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def no_redis_url(conn, env, tmp_path):
    env.delenv("REDIS_URL")
    env.setenv("XDG_STATE_HOME", str(tmp_path))
    return env


def test_without_redis_url_commands_use_the_url_leash_dev_recorded_and_say_so_once(no_redis_url):
    write_record(REDIS_URL, "http://127.0.0.1:5123", pid=4242)
    assert record_path().is_file() and record_path().stat().st_mode & 0o077 == 0  # it may hold a password
    submitted = CliRunner().invoke(main, ["submit", "--labels", "a,b", "-"], input="x\n")
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.stdout.strip()
    assert submitted.stderr.count("using the Redis of `leash dev`, " + REDIS_URL) == 1
    assert f"http://127.0.0.1:5123/jobs/{job_id}" in submitted.stderr  # the web app leash dev runs
    assert job_id in run("jobs").stdout
    remove_record(pid=1)  # not ours: kept
    assert record_path().is_file()
    remove_record(pid=4242)
    assert not record_path().exists()


@pytest.mark.parametrize("url", ["localhost:6379", "redis://localhost:abc/0", "http://localhost:6379"])
def test_a_malformed_redis_url_is_one_line_and_exit_2(conn, env, url):
    env.setenv("REDIS_URL", url)
    result = run("jobs")
    assert result.exit_code == 2
    assert "is not a Redis URL" in result.output and "redis://localhost:6379/0" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_an_unreachable_redis_is_one_line_naming_the_url_without_its_password(conn, env):
    port = free_port()
    env.setenv("REDIS_URL", f"redis://:hunter2@127.0.0.1:{port}/0")
    result = run("status", "some-id")
    assert result.exit_code == 1
    assert f"cannot reach Redis at redis://:***@127.0.0.1:{port}/0" in result.output
    assert "hunter2" not in result.output and len(result.output.strip().splitlines()) == 1


def test_a_stale_record_asks_whether_leash_dev_still_runs(no_redis_url):
    write_record(f"redis://127.0.0.1:{free_port()}/0", "http://127.0.0.1:5000", pid=1)
    result = run("jobs")
    assert result.exit_code == 1 and "is `leash dev` still running?" in result.output


def test_leash_dev_on_a_busy_port_is_one_line_with_the_fix(conn, env):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run("dev", "--port", str(port))
    assert result.exit_code == 2
    assert f"port {port} is in use by another program; run leash dev --port " in result.output
    assert len(result.output.strip().splitlines()) == 1
