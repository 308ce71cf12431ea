"""Guessing is slow: failed sign-ins, unknown bearer tokens, wrong dashboard and metrics
passwords are limited per client address and per failing guess (LEASH_GUESS_RATE): a 429 with
Retry-After, the right secret refused too from a refused address, and one WARNING line per
burst. No count is kept by user name or token prefix alone, so guessers cannot lock the
rightful user out."""

from __future__ import annotations

import logging

import pytest

from tests.web_support import HTML, TOKENS, basic, create_app_with, csrf_from

TOKEN_LIST = ",".join(f"{o}={t}" for o, t in TOKENS.items())


@pytest.fixture
def app(conn, monkeypatch):
    monkeypatch.setenv("LEASH_GUESS_RATE", "3/minute")
    return create_app_with(LEASH_API_TOKENS=TOKEN_LIST, LEASH_DASHBOARD_USER="operator", LEASH_DASHBOARD_PASSWORD="pw",
                           LEASH_METRICS_TOKEN="metrics-token-0123456789")


def _from(app, address: str):
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    return client


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "web.guessing" and r.levelno == logging.WARNING]


def _bearer_guess(client, token: str):
    return client.get("/jobs", headers={"Authorization": f"Bearer {token}"})


def test_bearer_guesses_from_one_address_are_refused_after_the_limit(app, caplog):
    guesser = _from(app, "203.0.113.5")
    statuses = [_bearer_guess(guesser, f"guess-{n:04d}-abcdefgh").status_code for n in range(6)]
    assert statuses == [401, 401, 401, 429, 429, 429]
    refused = _bearer_guess(guesser, TOKENS["alice"])  # the right token too, while refused
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert "LEASH_GUESS_RATE" in refused.get_json()["error"]
    assert len(_warnings(caplog)) == 1 and "203.0.113.5" in _warnings(caplog)[0]
    # Another address with a good token is not slowed; its own good requests never count.
    other = _from(app, "198.51.100.7")
    assert [_bearer_guess(other, TOKENS["bob"]).status_code for _ in range(6)] == [200] * 6


def test_one_wrong_token_from_many_addresses_is_refused_but_the_right_one_with_its_prefix_gets_in(app, caplog):
    prefix = TOKENS["alice"][:8]
    statuses = [_bearer_guess(_from(app, f"192.0.2.{n}"), prefix + "wrong").status_code for n in range(5)]
    assert statuses == [401, 401, 401, 429, 429]  # the failing guess itself, whoever sends it
    assert len(_warnings(caplog)) == 1
    # Guesses at the known first characters, one per address: none locks the rightful token out.
    assert [_bearer_guess(_from(app, f"192.0.2.{n}"), prefix + f"wrong{n}").status_code
            for n in range(10, 20)] == [401] * 10
    assert _bearer_guess(_from(app, "192.0.2.99"), TOKENS["alice"]).status_code == 200


def test_the_rightful_operator_gets_in_while_guessers_at_their_name_are_refused(app):
    """10 wrong passwords for the user name from one address and 1 from another: the guessers
    are throttled, the operator with the right password from a third address is not."""
    guesser = _from(app, "203.0.113.20")
    statuses = [guesser.get("/rq/", headers=basic("operator", f"guess{n}")).status_code for n in range(10)]
    assert statuses[:3] == [401] * 3 and set(statuses[3:]) == {429}
    assert _from(app, "203.0.113.21").get("/rq/", headers=basic("operator", "guess-x")).status_code == 401
    assert _from(app, "198.51.100.30").get("/rq/", headers=basic("operator", "pw")).status_code == 200
    # The same for sign-ins with a token whose first characters are known.
    prefix = TOKENS["bob"][:8]
    for n in range(10):
        _bearer_guess(_from(app, "203.0.113.22"), prefix + f"guess{n}")
    browser = _from(app, "198.51.100.31")
    page = browser.get("/signin", headers=HTML)
    right = browser.post("/signin", headers=HTML, data={"token": TOKENS["bob"], "next": "/",
                                                        "csrf_token": csrf_from(page.data)})
    assert right.status_code == 303, right.status_code


def test_failed_sign_ins_are_limited(app):
    browser = _from(app, "203.0.113.9")
    statuses = []
    for n in range(5):
        page = browser.get("/signin", headers=HTML)
        statuses.append(browser.post("/signin", headers=HTML, data={
            "token": f"wrong-token-{n}", "next": "/", "csrf_token": csrf_from(page.data)}).status_code)
    assert statuses == [401, 401, 401, 429, 429]
    page = browser.get("/signin", headers=HTML)
    right = browser.post("/signin", headers=HTML, data={"token": TOKENS["alice"], "next": "/",
                                                        "csrf_token": csrf_from(page.data)})
    assert right.status_code == 429 and right.headers["Retry-After"]


def test_dashboard_and_metrics_passwords_are_limited(app):
    guesser = _from(app, "203.0.113.11")
    dashboard = [guesser.get("/rq/", headers=basic("operator", f"guess{n}")).status_code for n in range(5)]
    assert dashboard == [401, 401, 401, 429, 429]
    assert guesser.get("/rq/", headers=basic("operator", "pw")).status_code == 429
    assert _from(app, "198.51.100.1").get("/rq/", headers=basic("operator", "pw")).status_code == 200
    metrics = [guesser.get("/metrics", headers={"Authorization": f"Bearer m{n}"}).status_code for n in range(5)]
    assert metrics == [401, 401, 401, 429, 429]


def _status(url: str, headers: dict) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize("trusted", ["*", ""])
def test_the_client_address_is_read_from_a_trusted_proxy_only(web_server, trusted):
    server = web_server(extra_env={"LEASH_API_TOKENS": TOKEN_LIST, "LEASH_GUESS_RATE": "2/minute",
                                   "LEASH_TRUSTED_PROXIES": trusted})
    statuses = [_status(server.url + "/jobs", {"Authorization": f"Bearer guess{n}-{n:08d}",
                                               "X-Forwarded-For": f"198.51.100.{n}"}) for n in range(4)]
    # Behind the proxy each forwarded address is its own client; without it, one peer guessing.
    assert statuses == ([401] * 4 if trusted else [401, 401, 429, 429])
