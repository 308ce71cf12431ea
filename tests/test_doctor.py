"""``leash doctor`` tells a fit Redis from one that loses jobs, and workers and the web app say
at start when Redis may evict (each against a redis-server of the test's own)."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
import redis
from click.testing import CliRunner
from rq.serializers import JSONSerializer
from rq.utils import now as rq_now
from rq.utils import utcformat
from rq.worker import Worker

from cli import main
from cli.devserver import start_redis, stop
from tests.conftest import wait_for
from tests.web_support import create_app_with


@pytest.fixture
def own_redis(tmp_path, env):
    """A redis-server of this test's own: its settings are the test's to change."""
    def start(appendonly: bool = False):
        workdir = tmp_path / f"redis-{len(started)}"
        workdir.mkdir()
        proc, url = start_redis(workdir, appendonly=appendonly)
        started.append(proc)
        env.setenv("REDIS_URL", url)
        return redis.Redis.from_url(url), url

    started: list = []
    yield start
    stop(started, grace=5)


def _worker_record(connection, name: str, heartbeat_offset: float = 0.0) -> None:
    """A worker as RQ records it, with its last heartbeat stamped by a clock ``offset`` s off."""
    worker = Worker(["leash"], connection=connection, name=name, serializer=JSONSerializer)
    worker.register_birth()
    connection.hset(worker.key, "last_heartbeat", utcformat(rq_now() + timedelta(seconds=heartbeat_offset)))


def doctor(*args):
    return CliRunner().invoke(main, ["doctor", *args])


def test_doctor_passes_a_persistent_noeviction_redis_with_a_worker_whose_clock_agrees(own_redis):
    conn, _ = own_redis(appendonly=True)
    conn.config_set("maxmemory", 512 * 2**20)
    _worker_record(conn, "on-time")
    result = doctor()
    assert result.exit_code == 0, result.output
    assert "FAIL" not in result.output
    for name in ("server", "persistence", "maxmemory-policy", "memory headroom", "clients", "workers",
                 "clock of worker on-time"):
        assert f"{name}:" in result.output


def test_doctor_fails_without_persistence_with_an_evicting_policy_and_a_skewed_worker(own_redis):
    conn, _ = own_redis()
    conn.config_set("save", "")
    _worker_record(conn, "ahead", heartbeat_offset=30)
    conn.config_set("maxmemory-policy", "volatile-lru")
    conn.config_set("maxmemory", 512 * 2**20)
    result = doctor("--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    verdicts = {c["name"]: c["verdict"] for c in report["checks"]}
    assert report["ok"] is False
    assert verdicts["persistence"] == "fail"
    assert verdicts["maxmemory-policy"] == "fail"
    assert verdicts["memory headroom"] == "ok"
    assert verdicts["clock of worker ahead"] == "fail"
    assert verdicts["server"] == "ok"
    text = doctor().output
    assert "FAIL  maxmemory-policy: maxmemory-policy volatile-lru lets Redis evict keys" in text
    assert "ahead of Redis' clock" in text


def test_doctor_fails_a_redis_without_headroom_and_warns_of_a_silent_worker(own_redis):
    conn, _ = own_redis(appendonly=True)
    _worker_record(conn, "silent", heartbeat_offset=-300)
    conn.config_set("maxmemory", int(conn.info("memory")["used_memory"] * 1.02))
    result = doctor()
    assert result.exit_code == 1, result.output
    assert "FAIL  memory headroom:" in result.output and "shorten LEASH_RESULT_TTL" in result.output
    assert "warn  clock of worker silent: last heartbeat 300 s ago" in result.output


def test_doctor_fails_when_no_worker_is_there(own_redis):
    own_redis(appendonly=True)
    result = doctor()
    assert result.exit_code == 1
    assert "FAIL  workers: none seen" in result.output


@pytest.mark.slow
def test_workers_and_the_web_app_warn_once_at_start_when_redis_may_evict(own_redis, workers, tmp_path, caplog):
    conn, url = own_redis()
    conn.config_set("maxmemory-policy", "volatile-lru")
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        proc = workers.start("--burst", extra_env={"REDIS_URL": url}, stderr=log)
        wait_for(lambda: proc.poll() is not None, 30, message="the burst worker to finish")
    text = log_path.read_text()
    assert text.count("maxmemory-policy volatile-lru lets Redis evict keys") == 1, text
    assert "set maxmemory-policy noeviction" in text

    with caplog.at_level(logging.WARNING):
        create_app_with(REDIS_URL=url)
    warned = [r.getMessage() for r in caplog.records if "maxmemory-policy volatile-lru" in r.getMessage()]
    assert len(warned) == 1

    conn.config_set("maxmemory-policy", "noeviction")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        create_app_with(REDIS_URL=url)
    assert not [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]


@pytest.mark.parametrize(("info", "seen"), [
    ({"redis_version": "7.0.15"}, "Redis 7.0.15"),
    ({"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "9.1.0"},
     "Valkey 9.1.0 (answers as Redis 7.2.4)"),
    ({"redis_version": "6.0.9"}, "Redis 6.0.9: leash needs Redis 6.2 or newer (or Valkey)"),
])
def test_doctor_names_the_server_and_its_own_version(info, seen):
    from jobs.read.redis_health import _version

    assert _version(info).detail == seen


def test_doctor_names_the_server_it_talks_to(own_redis):
    conn, _ = own_redis(appendonly=True)
    info = conn.info("server")
    name = "Valkey " + info["valkey_version"] if "valkey_version" in info else "Redis " + info["redis_version"]
    assert f"ok    server: {name}" in doctor().output


def test_readiness_reports_a_full_redis_and_no_workers_while_liveness_stays_200(own_redis):
    """A load balancer keeps reads in rotation (/healthz: 200) while /readyz tells a monitor the
    truth: Redis refusing writes, no worker to run jobs."""
    from jobs.read.redis_health import NO_WORKERS, WRITES_REFUSED

    conn, url = own_redis(appendonly=True)
    client = create_app_with(REDIS_URL=url).test_client()
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.get_json()["problems"] == [NO_WORKERS]
    assert "no workers" in ready.get_json()["error"]
    _worker_record(conn, "w1")
    assert client.get("/readyz").status_code == 200 and client.get("/readyz").get_json() == {"ok": True}
    conn.config_set("maxmemory", 1)  # every write that may add memory is refused (noeviction)
    try:
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.get_json()["problems"] == [WRITES_REFUSED]
        assert ready.get_json()["error"].startswith("writes refused (Redis full)")
        assert client.get("/healthz?deep=1").status_code == 503
        assert client.get("/healthz").status_code == 200  # liveness: reads are still served
    finally:
        conn.config_set("maxmemory", 0)
    assert client.get("/readyz").status_code == 200


def test_doctor_warns_when_every_peer_is_trusted_and_a_request_came_without_the_routers_header(conn, env, caplog):
    env.setenv("LEASH_TRUSTED_PROXIES", "*")
    client = create_app_with().test_client()
    assert client.get("/jobs", headers={"X-Forwarded-For": "198.51.100.7"}).status_code == 200
    assert client.get("/healthz").status_code == 200  # the platform's own probe: not counted
    ok = json.loads(doctor("--json").stdout)
    [proxies] = [c for c in ok["checks"] if c["name"] == "trusted proxies"]
    assert proxies["verdict"] == "ok"
    with caplog.at_level(logging.WARNING, logger="web.proxy_check"):
        client.get("/jobs", environ_base={"REMOTE_ADDR": "203.0.113.66"})  # straight to the app
        client.get("/jobs", environ_base={"REMOTE_ADDR": "203.0.113.67"})
    assert len([r for r in caplog.records if r.name == "web.proxy_check"]) == 1
    warned = json.loads(doctor("--json").stdout)
    [proxies] = [c for c in warned["checks"] if c["name"] == "trusted proxies"]
    assert proxies["verdict"] == "warn" and "203.0.113.66" in proxies["detail"] and "X-Forwarded-For" in proxies["detail"]
    env.delenv("LEASH_TRUSTED_PROXIES")
    assert not [c for c in json.loads(doctor("--json").stdout)["checks"] if c["name"] == "trusted proxies"]
