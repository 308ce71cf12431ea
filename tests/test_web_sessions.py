"""Signing out ends the session for every copy of its cookie (removing the token does too:
tests/test_web_signin.py); an owner keeps at most LEASH_MAX_SESSIONS, the oldest signed out first;
a token removed and added back does not bring its sessions back."""

from __future__ import annotations

import re

from jobs import keys
from jobs.intake import sessions
from tests.web_support import HTML, TOKENS, bearer, create_app_with, sign_in

TOKEN_LIST = ",".join(f"{o}={t}" for o, t in TOKENS.items())


def _cookie(client) -> str:
    return client.get_cookie("leash_session").value


def _reads_jobs(app, cookie: str) -> bool:
    thief = app.test_client()
    thief.set_cookie("leash_session", cookie)
    response = thief.get("/jobs", headers=HTML)
    return response.status_code == 200


def test_a_cookie_copied_before_sign_out_no_longer_reads_jobs(conn):
    app = create_app_with(LEASH_API_TOKENS=TOKEN_LIST)
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
    assert conn.hlen(keys.owner_sessions("alice")) == 0 and conn.zcard(keys.owner_session_expiries("alice")) == 0


def test_a_session_lives_as_long_as_the_cookie_and_other_sessions_of_the_owner_stay(conn):
    app = create_app_with(LEASH_API_TOKENS=TOKEN_LIST)
    first, second = app.test_client(), app.test_client()
    sign_in(first, "alice")
    sign_in(second, "alice")
    assert conn.hlen(keys.owner_sessions("alice")) == 2
    for key in (keys.owner_sessions("alice"), keys.owner_session_expiries("alice")):
        assert 0 < conn.ttl(key) <= app.permanent_session_lifetime.total_seconds()
    page = first.get("/jobs", headers=HTML)
    token = re.search(rb'name="csrf_token" value="([^"]+)"', page.data) or \
        re.search(rb'name="csrf_token" type="hidden" value="([^"]+)"', page.data)
    first.post("/signout", data={"csrf_token": token.group(1).decode()}, headers=HTML)
    assert second.get("/jobs", headers=HTML).status_code == 200
    assert first.get("/jobs", headers=bearer("alice")).status_code == 200  # tokens are not sessions


def test_a_cookie_signed_in_before_sessions_were_kept_must_sign_in_again(conn):
    app = create_app_with(LEASH_API_TOKENS=TOKEN_LIST)
    browser = app.test_client()
    sign_in(browser, "alice")
    with browser.session_transaction() as session:
        session.pop("session_id")
    assert browser.get("/jobs", headers=HTML).status_code == 303


def test_an_owner_keeps_at_most_its_session_cap_and_the_oldest_go_first(conn):
    app = create_app_with(LEASH_API_TOKENS=TOKEN_LIST, LEASH_MAX_SESSIONS=3)
    browsers = [app.test_client() for _ in range(5)]
    for browser in browsers:
        assert sign_in(browser, "alice").status_code == 303
    reads = [browser.get("/jobs", headers=HTML).status_code for browser in browsers]
    assert reads == [303, 303, 200, 200, 200]  # the two oldest are sent to sign in again
    assert sessions.count(conn, "alice") == 3
    other = app.test_client()
    sign_in(other, "bob")  # another owner's sign-in takes nothing from alice
    assert [browser.get("/jobs", headers=HTML).status_code for browser in browsers[2:]] == [200, 200, 200]


def test_a_token_removed_and_added_back_does_not_bring_its_sessions_back(conn):
    with_token = create_app_with(LEASH_API_TOKENS=TOKEN_LIST)
    browser = with_token.test_client()
    sign_in(browser, "alice")
    cookie = _cookie(browser)
    assert _reads_jobs(with_token, cookie)
    without = ",".join(f"{o}={t}" for o, t in TOKENS.items() if o != "alice")
    create_app_with(LEASH_API_TOKENS=without)  # a deploy without alice's token: its start drops her sessions
    assert sessions.count(conn, "alice") == 0
    back = create_app_with(LEASH_API_TOKENS=TOKEN_LIST)  # the token added back
    assert not _reads_jobs(back, cookie)
    fresh = back.test_client()
    assert sign_in(fresh, "alice").status_code == 303 and fresh.get("/jobs", headers=HTML).status_code == 200


def test_a_session_met_after_its_token_was_removed_is_dropped_on_the_spot(conn):
    without = create_app_with(LEASH_API_TOKENS=",".join(f"{o}={t}" for o, t in TOKENS.items() if o != "alice"))
    with_token = create_app_with(LEASH_API_TOKENS=TOKEN_LIST)  # a process still started with the token
    browser = with_token.test_client()
    sign_in(browser, "alice")
    cookie = _cookie(browser)
    assert sessions.count(conn, "alice") == 1
    assert not _reads_jobs(without, cookie)
    assert sessions.count(conn, "alice") == 0
    assert not _reads_jobs(with_token, cookie)


def test_the_web_app_starts_when_redis_is_away_and_sweeps_at_its_next_start(conn, caplog):
    app = create_app_with(LEASH_API_TOKENS=TOKEN_LIST, REDIS_URL="redis://127.0.0.1:1/0")
    assert app is not None
    assert "swept at the next start" in caplog.text


def test_signing_in_again_in_the_same_browser_ends_its_previous_session_and_takes_no_other_place(conn):
    app = create_app_with(LEASH_API_TOKENS=TOKEN_LIST, LEASH_MAX_SESSIONS=2)
    phone, laptop = app.test_client(), app.test_client()
    sign_in(phone, "alice")
    sign_in(laptop, "alice")
    before = _cookie(laptop)
    for _ in range(3):  # the laptop signs in again (a second tab, a bookmark to the sign-in page)
        assert sign_in(laptop, "alice").status_code == 303
    assert phone.get("/jobs", headers=HTML).status_code == 200  # the phone kept its place
    assert laptop.get("/jobs", headers=HTML).status_code == 200
    assert not _reads_jobs(app, before)  # the laptop's earlier session is gone with its cookie's copies
    assert sessions.count(conn, "alice") == 2
