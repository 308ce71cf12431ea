"""Signing out ends the session for every copy of its cookie (removing the token does too:
tests/test_web_signin.py)."""

from __future__ import annotations

import re

from jobs import keys
from tests.web_support import HTML, TOKENS, bearer, make_app, sign_in

TOKEN_LIST = ",".join(f"{o}={t}" for o, t in TOKENS.items())


def _cookie(client) -> str:
    return client.get_cookie("leash_session").value


def _reads_jobs(app, cookie: str) -> bool:
    thief = app.test_client()
    thief.set_cookie("leash_session", cookie)
    response = thief.get("/jobs", headers=HTML)
    return response.status_code == 200


def test_a_cookie_copied_before_sign_out_no_longer_reads_jobs(conn):
    app = make_app(LEASH_API_TOKENS=TOKEN_LIST)
    browser = app.test_client()
    assert sign_in(browser, "alice").status_code == 303
    copied = _cookie(browser)
    assert _reads_jobs(app, copied)
    page = browser.get("/jobs", headers=HTML)
    token = re.search(rb'name="csrf_token" value="([^"]+)"', page.data) or \
        re.search(rb'name="csrf_token" type="hidden" value="([^"]+)"', page.data)
    assert browser.post("/signout", data={"csrf_token": token.group(1).decode()}, headers=HTML).status_code == 303
    assert not _reads_jobs(app, copied)
    assert browser.get("/jobs", headers=HTML).status_code == 303  # the browser itself: to the sign-in page
    assert conn.keys(keys.browser_session("*")) == []


def test_a_session_lives_as_long_as_the_cookie_and_other_sessions_of_the_owner_stay(conn):
    app = make_app(LEASH_API_TOKENS=TOKEN_LIST)
    first, second = app.test_client(), app.test_client()
    sign_in(first, "alice")
    sign_in(second, "alice")
    [key, _] = conn.keys(keys.browser_session("*"))
    assert 0 < conn.ttl(key) <= app.permanent_session_lifetime.total_seconds()
    page = first.get("/jobs", headers=HTML)
    token = re.search(rb'name="csrf_token" value="([^"]+)"', page.data) or \
        re.search(rb'name="csrf_token" type="hidden" value="([^"]+)"', page.data)
    first.post("/signout", data={"csrf_token": token.group(1).decode()}, headers=HTML)
    assert second.get("/jobs", headers=HTML).status_code == 200
    assert first.get("/jobs", headers=bearer("alice")).status_code == 200  # tokens are not sessions


def test_a_cookie_signed_in_before_sessions_were_kept_must_sign_in_again(conn):
    app = make_app(LEASH_API_TOKENS=TOKEN_LIST)
    browser = app.test_client()
    sign_in(browser, "alice")
    with browser.session_transaction() as session:
        session.pop("session_id")
    assert browser.get("/jobs", headers=HTML).status_code == 303
