"""Every leash command finds the Redis `leash dev` runs (of several, too), says which Redis
when it cannot, and never falls back to a Redis nobody named."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cli import main
from cli.devrecord import records_dir, remove_record, write_record
from cli.devserver import free_port
from jobs.core.store.connection import masked
from tests.conftest import REDIS_URL


def run(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


@pytest.fixture
def no_redis_url(conn, env, tmp_path):
    env.delenv("REDIS_URL")
    env.setenv("XDG_STATE_HOME", str(tmp_path))
    return env


def test_without_redis_url_commands_use_the_url_leash_dev_recorded_and_say_so_once(no_redis_url):
    record = write_record(REDIS_URL, "http://127.0.0.1:5123", pid=os.getpid())
    assert record.is_file() and record.stat().st_mode & 0o077 == 0  # it may hold a password
    submitted = CliRunner().invoke(main, ["submit", "--labels", "a,b", "-"], input="x\n")
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.stdout.strip()
    assert submitted.stderr.count(f"using `leash dev` at http://127.0.0.1:5123 (Redis {REDIS_URL})") == 1
    assert f"http://127.0.0.1:5123/jobs/{job_id}" in submitted.stderr  # the web app leash dev runs
    listed = run("jobs")
    assert job_id in listed.stdout
    assert "using `leash dev`" not in listed.stderr, "one notice per terminal session"
    remove_record(pid=os.getpid())
    assert not record.exists()


def test_stopping_one_of_two_dev_servers_leaves_the_other_found(no_redis_url, tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_record(REDIS_URL, "http://127.0.0.1:5123", pid=other.pid)
        write_record("redis://127.0.0.1:1/0", "http://127.0.0.1:5124", pid=os.getpid())
        remove_record(pid=os.getpid())  # the second one stops: the first is still found
        job_id = run("submit", "--labels", "a,b", "-", input="x\n").stdout.strip()
        assert job_id and job_id in run("jobs").stdout
        other.kill()
        other.wait()
        # Its process is gone (SIGKILLed, no clean-up): its record is not believed.
        result = run("jobs")
        assert result.exit_code == 3
        assert "no `leash dev` is running and REDIS_URL is not set" in result.output
        assert len(result.output.strip().splitlines()) == 1
        assert not list(records_dir().glob("*.json"))
    finally:
        other.kill()
        other.wait()


def test_of_two_running_dev_servers_leash_web_url_picks_one(no_redis_url):
    write_record("redis://127.0.0.1:1/0", "http://127.0.0.1:5124", pid=os.getpid())
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_record(REDIS_URL, "http://127.0.0.1:5123", pid=sleeper.pid)
        os.utime(records_dir() / f"{sleeper.pid}.json", (0, 0))  # the older: not the default choice
        assert run("jobs").exit_code == 3  # the newest, whose Redis is gone
        no_redis_url.setenv("LEASH_WEB_URL", "http://127.0.0.1:5123/")
        chosen = run("jobs")
        assert chosen.exit_code == 0, chosen.output
        assert "1 other leash dev running, LEASH_WEB_URL picks one" in chosen.stderr
    finally:
        sleeper.kill()
        sleeper.wait()


def test_without_redis_url_or_leash_dev_no_redis_is_guessed(no_redis_url):
    result = run("submit", "--labels", "a,b", "-", input="x\n")
    assert result.exit_code == 3
    assert result.output.strip().splitlines() == [
        "Error: no Redis: no `leash dev` is running and REDIS_URL is not set; start `leash dev` in another "
        "terminal, or set REDIS_URL"]


@pytest.mark.parametrize("url", ["localhost:6379", "redis://localhost:abc/0", "http://localhost:6379",
                                 "redis://:pw-secret@[::1/0", "redis://:pw-secret@host:port/0"])
@pytest.mark.parametrize("command", [("jobs",), ("status", "x"), ("worker",), ("web", "--port", "1")])
def test_a_malformed_redis_url_is_one_line_and_exit_2(conn, env, url, command):
    env.setenv("REDIS_URL", url)
    result = run(*command)
    assert result.exit_code == 2
    assert "is not a Redis URL" in result.output and "redis://localhost:6379/0" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert "pw-secret" not in result.output


@pytest.mark.parametrize("url,expected", [
    ("redis://:hunter2@[::1/0", "redis://:***@[::1/0"),
    ("redis://user:p@ss@host:6379/0", "redis://user:***@host:6379/0"),
    ("rediss://default:hunter2@host:6379", "rediss://default:***@host:6379"),
    ("redis://host:6379/0?password=hunter2&db=1", "redis://host:6379/0?password=***&db=1"),
    ("redis://host:6379/0", "redis://host:6379/0"),
])
def test_passwords_are_masked_even_in_urls_too_malformed_to_parse(url, expected):
    assert masked(url) == expected


def test_an_unreachable_redis_is_one_line_naming_the_url_without_its_password(conn, env):
    port = free_port()
    env.setenv("REDIS_URL", f"redis://:hunter2@127.0.0.1:{port}/0")
    result = run("status", "some-id")
    assert result.exit_code == 3
    assert f"cannot reach Redis at redis://:***@127.0.0.1:{port}/0" in result.output
    assert "hunter2" not in result.output and len(result.output.strip().splitlines()) == 1


def test_a_stale_record_asks_whether_leash_dev_still_runs(no_redis_url):
    write_record(f"redis://127.0.0.1:{free_port()}/0", "http://127.0.0.1:5000", pid=os.getpid())
    result = run("jobs")
    assert result.exit_code == 3 and "is `leash dev` still running?" in result.output


def test_leash_dev_on_a_busy_port_is_one_line_with_the_fix(conn, env):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run("dev", "--port", str(port))
    assert result.exit_code == 2
    assert f"port {port} is in use by another program; run leash dev --port " in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_dev_record_is_the_users_alone_and_never_written_through_a_planted_file_or_symlink(env, tmp_path):
    env.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    folder = tmp_path / "state" / "leash" / "dev"
    folder.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (folder / "7.json.tmp").symlink_to(victim)  # a fixed temporary name, planted
    (folder / "7.json").symlink_to(victim)
    planted = folder / ".7.json.planted.tmp"
    planted.write_text("world readable")
    planted.chmod(0o644)
    path = write_record("redis://:hunter2@127.0.0.1:6379/0", "http://127.0.0.1:5000", pid=7)
    assert victim.read_text() == "keep me"
    assert not path.is_symlink() and path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text())["pid"] == 7
    assert sorted(p.name for p in folder.iterdir()) == [".7.json.planted.tmp", "7.json", "7.json.tmp"]
    path.chmod(0o644)  # a record left readable by an older version is replaced, not reused
    assert write_record("redis://127.0.0.1:6379/0", "http://127.0.0.1:5000", pid=8).stat().st_mode & 0o777 == 0o600


def test_a_second_leash_dev_on_the_same_data_is_one_line_and_exit_2(no_redis_url):
    from cli.devserver import lock_data

    port = free_port()
    held = lock_data(port, fresh=False)  # a running leash dev (or its orphaned Redis) holds it
    try:
        result = run("dev", "--port", str(port))
    finally:
        held.close()
    assert result.exit_code == 2
    assert "is using" in result.output and f"dev-{port}" in result.output
    assert len(result.output.strip().splitlines()) == 1
