"""Completion webhooks: a signed POST when a job ends (Standard Webhooks), delivered at least
once with one id by an RQ job of its own, retried with backoff, refused for private addresses
unless the deployment allows them, each attempt shown in the job's status."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from standardwebhooks import Webhook

from jobs import keys
from jobs.core import control, states
from jobs.enqueue import enqueue
from jobs.errors import InvalidJob
from jobs.webhooks import addresses, outbox, signing
from tests.conftest import REDIS_URL, ROOT, wait_for
from tests.web_support import CLASSIFY
from tests.webhook_receiver import Receiver

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture
def hooks(env):
    env.setenv("LEASH_WEBHOOK_SECRET", SECRET)
    env.setenv("LEASH_WEBHOOK_ALLOW_PRIVATE", "1")
    env.setenv("LEASH_WEBHOOK_BACKOFF", "0,0,0")  # three retries at once
    return env


def verified(headers: dict, body: str, secret: str = SECRET) -> dict:
    """The body as the spec's reference library verifies it (raises if the signature is wrong)."""
    return Webhook(secret if secret.startswith("whsec_") else secret.encode()).verify(body, headers)


def run_webhooks(conn, burst, follow: float = 0) -> None:
    """Work the job, let the sweep start its webhook, work the deliveries (and their retries)."""
    burst()
    outbox.sweep(conn)
    burst(follow=follow)


# --- signing ---------------------------------------------------------------------------------

def test_the_signature_is_the_specs_own_example():
    # The example of the Standard Webhooks specification (its test vectors).
    headers = signing.headers(SECRET, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, '{"test": 2432232314}')
    assert headers["webhook-signature"] == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert headers["webhook-id"] == "msg_p5jXN8AQM9LWM0D4loKWxJek" and headers["webhook-timestamp"] == "1614265330"


def test_a_raw_secret_signs_with_its_own_bytes():
    import base64
    import hashlib
    import hmac

    headers = signing.headers("correct horse battery staple", "msg_1", 1700000000, '{"a":1}')
    expected = base64.b64encode(hmac.new(b"correct horse battery staple", b'msg_1.1700000000.{"a":1}',
                                         hashlib.sha256).digest()).decode()
    assert headers["webhook-signature"] == f"v1,{expected}"


def test_no_secret_refuses_to_sign():
    with pytest.raises(InvalidJob, match="LEASH_WEBHOOK_SECRET"):
        signing.headers(None, "msg_1", 1, "{}")


# --- addresses -------------------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9/hook", "http://localhost/hook", "http://10.1.2.3/", "http://192.168.0.10/",
    "http://169.254.169.254/latest/meta-data", "http://[::1]/", "http://[::ffff:127.0.0.1]/", "http://0.0.0.0/",
    "https://100.64.0.1/",
])
def test_private_loopback_and_link_local_addresses_are_refused(url):
    with pytest.raises(InvalidJob, match="private, loopback or reserved"):
        addresses.check(url, allow_private=False)
    assert addresses.check(url, allow_private=True).addresses


@pytest.mark.parametrize("url, message", [
    ("ftp://example.com/", "http:// or https://"), ("http:///nohost", "http:// or https://"),
    ("http://user:pw@example.com/", "user name or password"), ("http://exa mple.com/", "spaces"),
    ("http://no-such-host.invalid/", "does not resolve"), ("http://x.com:99999/", "not a valid URL"),
    (7, "http:// or https://"), ("http://x.com/" + "a" * 500, "at most 500"),
])
def test_a_malformed_or_unresolvable_url_is_refused(url, message):
    with pytest.raises(InvalidJob, match=message):
        addresses.check(url, allow_private=True)


def test_a_public_address_is_taken():
    target = addresses.check("https://93.184.215.14:8443/in?x=1", allow_private=False)
    assert (target.scheme, target.host, target.port, target.path) == ("https", "93.184.215.14", 8443, "/in?x=1")


# --- the doors -------------------------------------------------------------------------------

def test_the_api_refuses_a_private_webhook_with_422_and_takes_it_when_allowed(client, conn, env):
    env.setenv("LEASH_WEBHOOK_SECRET", SECRET)
    refused = client.post("/jobs", json={**CLASSIFY, "webhook_url": "http://127.0.0.1:8080/hook"})
    assert refused.status_code == 422 and "LEASH_WEBHOOK_ALLOW_PRIVATE" in refused.get_json()["error"]
    dry = client.post("/jobs", json={**CLASSIFY, "webhook_url": "http://10.0.0.1/", "dry_run": True})
    assert dry.status_code == 422
    env.setenv("LEASH_WEBHOOK_ALLOW_PRIVATE", "1")
    taken = client.post("/jobs", json={**CLASSIFY, "webhook_url": "http://127.0.0.1:8080/hook"})
    assert taken.status_code == 202
    status = client.get(taken.get_json()["url"]).get_json()
    assert status["webhook"] == {"url": "http://127.0.0.1:8080/hook", "id": None, "state": "waiting",
                                 "attempts": 0, "deliveries": []}
    assert client.post("/jobs", json=CLASSIFY).status_code == 202  # none asked, none set: no webhook
    assert [j["webhook"] for j in client.get("/jobs").get_json()["jobs"]].count(None) == 1


def test_a_webhook_without_a_secret_on_the_deployment_is_refused(client, conn, env):
    refused = client.post("/jobs", json={**CLASSIFY, "webhook_url": "http://93.184.215.14/hook"})
    assert refused.status_code == 422 and "LEASH_WEBHOOK_SECRET" in refused.get_json()["error"]
    assert conn.zcard(keys.owner_jobs("default")) == 0


def test_the_cli_takes_webhook_and_refuses_a_private_one_with_exit_2(conn, env, tmp_path):
    items = tmp_path / "items.txt"
    items.write_text("one\n")
    command = [sys.executable, "-m", "cli", "submit", "--kind", "noop", "--webhook", "http://127.0.0.1:1/h",
               str(items)]
    run_env = {"PATH": "/usr/bin:/bin", "REDIS_URL": REDIS_URL, "LEASH_IMPORTS": "tests.kinds_for_tests",
               "LEASH_WEBHOOK_SECRET": SECRET, "PYTHONPATH": str(ROOT)}
    refused = subprocess.run(command, env=run_env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--webhook goes to a private" in refused.stderr
    taken = subprocess.run(command, env={**run_env, "LEASH_WEBHOOK_ALLOW_PRIVATE": "1"}, cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert taken.returncode == 0, taken.stderr
    assert conn.hget(keys.job(taken.stdout.strip()), "webhook_url") == b"http://127.0.0.1:1/h"


# --- deliveries ------------------------------------------------------------------------------

def test_a_job_that_ends_posts_one_signed_webhook_with_its_status(conn, burst, hooks, receiver):
    job_id, _ = enqueue(conn, "noop", {}, webhook_url=receiver.url)
    run_webhooks(conn, burst)
    assert len(receiver.received) == 1
    headers, body = receiver.received[0]
    event = verified(headers, body)
    assert event["type"] == "job.succeeded" and event["data"]["job_id"] == job_id
    assert event["data"]["state"] == "succeeded" and "webhook" not in event["data"]
    assert headers["webhook-id"].startswith(f"msg_{job_id}_") and headers["user-agent"] == "leash-webhooks"
    hook = states.status(conn, job_id)["webhook"]
    assert hook["id"] == headers["webhook-id"] and hook["state"] == "delivered" and hook["attempts"] == 1
    assert [(d["attempt"], d["status"], d["error"]) for d in hook["deliveries"]] == [(1, 200, None)]


def test_a_second_sweep_starts_nothing_twice(conn, burst, hooks, receiver):
    job_id, _ = enqueue(conn, "noop", {}, webhook_url=receiver.url)
    burst()
    outbox.sweep(conn)  # the in-process worker's own tick may have started it already
    conn.zadd(keys.WEBHOOKS_DUE, {job_id: 1})  # noted again (the sweep's second look at an ended job)
    assert outbox.sweep(conn) == 0 and conn.zcard(keys.WEBHOOKS_DUE) == 0
    burst()
    assert len(receiver.received) == 1 and states.status(conn, job_id)["webhook"]["attempts"] == 1


def test_failed_and_canceled_jobs_say_so_and_a_job_without_a_webhook_sends_none(conn, burst, hooks, receiver):
    failed, _ = enqueue(conn, "boom", {}, max_attempts=1, webhook_url=receiver.url)
    canceled, _ = enqueue(conn, "noop", {}, webhook_url=receiver.url)
    control.cancel(conn, canceled)
    enqueue(conn, "noop", {})
    run_webhooks(conn, burst)
    events = {verified(h, b)["data"]["job_id"]: verified(h, b) for h, b in receiver.received}
    assert {job: e["type"] for job, e in events.items()} == {failed: "job.failed", canceled: "job.canceled"}
    assert "boom on attempt 1" in events[failed]["data"]["error"]


def test_a_failed_delivery_is_retried_with_the_same_id_and_each_attempt_is_recorded(conn, burst, hooks, receiver):
    receiver.statuses = [500, 503]
    job_id, _ = enqueue(conn, "noop", {}, webhook_url=receiver.url)
    run_webhooks(conn, burst, follow=5)
    assert len(receiver.received) == 3
    assert len({h["webhook-id"] for h, _ in receiver.received}) == 1
    assert len({b for _, b in receiver.received}) == 1  # the same body every time
    for headers, body in receiver.received:
        verified(headers, body)
    hook = states.status(conn, job_id)["webhook"]
    assert hook["state"] == "delivered" and hook["attempts"] == 3
    assert [(d["attempt"], d["status"], d["error"]) for d in hook["deliveries"]] == [
        (1, 500, "HTTP 500"), (2, 503, "HTTP 503"), (3, 200, None)]


def test_a_webhook_is_given_up_after_its_last_backoff_interval(conn, burst, hooks, receiver):
    hooks.setenv("LEASH_WEBHOOK_BACKOFF", "0")  # one retry
    receiver.statuses = [500] * 5
    job_id, _ = enqueue(conn, "noop", {}, webhook_url=receiver.url)
    run_webhooks(conn, burst, follow=5)
    assert len(receiver.received) == 2
    hook = states.status(conn, job_id)["webhook"]
    assert hook["state"] == "given up" and hook["attempts"] == 2


def test_the_deployment_default_goes_and_is_refused_at_delivery_when_private(conn, burst, hooks, receiver):
    hooks.setenv("LEASH_WEBHOOK_URL", receiver.url)
    sent, _ = enqueue(conn, "noop", {})
    hooks.setenv("LEASH_WEBHOOK_ALLOW_PRIVATE", "0")  # the deployment changed its mind before delivery
    refused, _ = enqueue(conn, "noop", {})
    assert conn.hget(keys.job(refused), "webhook_url") == receiver.url.encode()  # a default is the operator's
    run_webhooks(conn, burst)
    assert receiver.received == []
    for job_id in (sent, refused):
        hook = states.status(conn, job_id)["webhook"]
        assert hook["state"] == "given up" and "private, loopback" in hook["deliveries"][0]["error"]


def test_a_replayed_job_sends_a_new_webhook_for_its_new_ending(conn, burst, hooks, receiver):
    from jobs import deadletter

    job_id, _ = enqueue(conn, "boom", {}, max_attempts=1, webhook_url=receiver.url)
    run_webhooks(conn, burst)
    assert states.status(conn, job_id)["webhook"]["state"] == "delivered"
    deadletter.replay(conn, deadletter.select(conn, [job_id]).matched, "tester", {})
    assert states.status(conn, job_id)["webhook"]["state"] == "waiting"
    run_webhooks(conn, burst)
    ids = [h["webhook-id"] for h, _ in receiver.received]
    assert len(ids) == 2 and len(set(ids)) == 2
    assert states.status(conn, job_id)["webhook"]["id"] == ids[1]


@pytest.mark.slow
def test_a_receiver_down_for_30_seconds_gets_the_webhook_once_back_with_one_id_and_a_valid_signature(
        conn, env, workers):
    receiver = Receiver()
    port = receiver.port
    receiver.down()
    down_since = time.monotonic()
    hook_env = {"LEASH_WEBHOOK_SECRET": SECRET, "LEASH_WEBHOOK_ALLOW_PRIVATE": "1",
                "LEASH_WEBHOOK_BACKOFF": ",".join(["2"] * 100)}
    for name, value in hook_env.items():
        env.setenv(name, value)
    job_id, _ = enqueue(conn, "noop", {}, webhook_url=f"http://127.0.0.1:{port}/hook")
    workers.start(extra_env=hook_env)
    wait_for(lambda: (states.status(conn, job_id)["webhook"] or {}).get("attempts", 0) >= 3, 60,
             message="three failed deliveries while the receiver is down")
    time.sleep(max(0.0, 30 - (time.monotonic() - down_since)))  # the outage under test: 30 s in all
    down_attempts = states.status(conn, job_id)["webhook"]["attempts"]
    assert states.status(conn, job_id)["webhook"]["state"] == "pending"
    receiver = Receiver(port=port)
    try:
        wait_for(lambda: states.status(conn, job_id)["webhook"]["state"] == "delivered", 30,
                 message="the webhook delivered once the receiver is back")
        hook = states.status(conn, job_id)["webhook"]
        assert len(receiver.received) == 1
        headers, body = receiver.received[0]
        assert headers["webhook-id"] == hook["id"]
        assert verified(headers, body)["data"]["job_id"] == job_id
        assert hook["attempts"] > down_attempts >= 10
        assert all(d["error"] and "Connection" in d["error"] for d in hook["deliveries"][:-1])
    finally:
        receiver.down()


def test_the_job_page_shows_each_delivery(app, client, conn, burst, hooks, receiver):
    from tests.web_support import HTML, csrf_from

    browser = app.test_client()
    csrf_from(browser.get("/", headers=HTML).data)
    receiver.statuses = [502]
    job_id = client.post("/jobs", json={**CLASSIFY, "webhook_url": receiver.url}).get_json()["job_id"]
    waiting = browser.get(f"/jobs/{job_id}", headers=HTML).get_data(as_text=True)
    assert "sent when the job ends" in waiting and receiver.url.replace("&", "&amp;") in waiting
    run_webhooks(conn, burst)
    page = browser.get(f"/jobs/{job_id}", headers=HTML).get_data(as_text=True)
    delivery_id = states.status(conn, job_id)["webhook"]["id"]
    assert f"delivered after 2 attempts (id <code>{delivery_id}</code>)" in page
    rows = page.split('id="webhook-deliveries"')[1].split("</table>")[0]
    assert "<td>502</td>" in rows and "HTTP 502" in rows and "<td>200</td>" in rows


def test_a_webhook_adds_at_most_1_5_kb_to_the_job_record(conn, burst, hooks, receiver):
    hooks.setenv("LEASH_WEBHOOK_BACKOFF", "0,0,0,0,0,0,0")
    url = receiver.url + "&pad=" + "p" * (500 - len(receiver.url) - 5)
    job_id, _ = enqueue(conn, "noop", {}, webhook_url=url)
    hooks.setenv("LEASH_WEBHOOK_ALLOW_PRIVATE", "0")  # every attempt refused with a long message
    run_webhooks(conn, burst)
    record = conn.hgetall(keys.job(job_id))
    added = sum(len(k) + len(v) for k, v in record.items() if k.startswith(b"webhook_"))
    hook = states.status(conn, job_id)["webhook"]
    assert hook["attempts"] == 8 and len(hook["deliveries"]) == 5 and hook["state"] == "given up"
    assert [d["attempt"] for d in hook["deliveries"]] == [4, 5, 6, 7, 8]
    assert all(len(d["error"]) == 90 for d in hook["deliveries"])
    assert added <= 1536, added
