"""Nobody spends anonymously: with tokens set, the form and every page that acts need a
signed-in owner (a token at /signin, or a trusted proxy header when configured); the public
form is an explicit opt-in. Development (no tokens) is unchanged: tests/test_web_auth.py."""

from __future__ import annotations

import pytest

from jobs import keys
from jobs.enqueue import enqueue
from tests.web_support import CLASSIFY, HTML, TOKENS, bearer, create_app_with, csrf_from, sign_in

FORM = {"kind": "classify", "labels": "a, b", "items": "one\ntwo", "submission": "submission-1"}
TOKEN_LIST = ",".join(f"{o}={t}" for o, t in TOKENS.items())


def no_jobs(conn) -> bool:
    return not conn.keys(keys.job("*")) and not conn.keys(keys.payload("*"))


def submit_form(browser, csrf: str | None = None, headers: dict | None = None, submission: str = "submission-1"):
    if csrf is None:
        page = browser.get("/", headers={**HTML, **(headers or {})})
        assert page.status_code == 200, page.status_code
        csrf = csrf_from(page.data)
    return browser.post("/", data={**FORM, "csrf_token": csrf, "submission": submission},
                        headers={**HTML, **(headers or {})})


def test_an_anonymous_browser_writes_no_job_through_any_page_that_acts(token_app, conn):
    victim = enqueue(conn, "classify", {"items": ["x"], "labels": ["a", "b"]}, owner="alice")[0]
    browser = token_app.test_client()
    form = browser.get("/", headers=HTML)
    assert form.status_code == 303 and form.headers["Location"] == "/signin?next=/"
    # A CSRF token from the sign-in page does not make a visitor an owner.
    csrf = csrf_from(browser.get("/signin", headers=HTML).data)
    posted = browser.post("/", data={**FORM, "csrf_token": csrf}, headers=HTML)
    assert posted.status_code == 303 and posted.headers["Location"].startswith("/signin?next=")
    assert browser.post("/", data={**FORM, "csrf_token": csrf}).status_code == 401  # not a browser: JSON
    api = browser.post("/jobs", json=CLASSIFY, headers={"X-CSRFToken": csrf})
    assert api.status_code == 401 and "missing API token" in api.get_json()["error"]
    cancel = browser.post(f"/jobs/{victim}/cancel", headers={**HTML, "X-CSRFToken": csrf})
    assert cancel.status_code == 303 and cancel.headers["Location"].startswith("/signin")
    assert browser.post(f"/jobs/{victim}/cancel", headers={"X-CSRFToken": csrf}).status_code == 401
    assert conn.keys(keys.job("*")) == [keys.job(victim).encode()]
    assert conn.hget(keys.job(victim), "state") == b"queued"
    for path in ("/jobs", f"/jobs/{victim}"):  # reading needs an owner too
        assert browser.get(path, headers=HTML).status_code == 303
        assert browser.get(path).status_code == 401


def test_sign_in_then_submit_and_the_job_is_the_signed_in_owner_s(token_app, conn):
    browser = token_app.test_client()
    signed = sign_in(browser, "alice", next_path="/jobs?state=queued")
    assert signed.status_code == 303 and signed.headers["Location"] == "/jobs?state=queued"
    page = browser.get("/", headers=HTML)
    assert b"alice" in page.data and b"Sign out" in page.data
    posted = submit_form(browser)
    assert posted.status_code == 303
    job_id = posted.headers["Location"].rsplit("/", 1)[1]
    assert conn.hget(keys.job(job_id), "owner") == b"alice"
    assert browser.get(f"/jobs/{job_id}").get_json()["state"] == "queued"
    # The same job through alice's token; bob's browser cannot see it.
    assert token_app.test_client().get(f"/jobs/{job_id}", headers=bearer("alice")).status_code == 200
    other = token_app.test_client()
    sign_in(other, "bob")
    assert other.get(f"/jobs/{job_id}").status_code == 404
    # Signing out (a CSRF-protected form) forgets the owner.
    signout_csrf = csrf_from(browser.get("/jobs", headers=HTML).data)
    assert browser.post("/signout", data={}).status_code == 403
    out = browser.post("/signout", data={"csrf_token": signout_csrf}, headers=HTML)
    assert out.status_code == 303 and out.headers["Location"] == "/signin"
    assert browser.get("/", headers=HTML).status_code == 303


def test_sign_in_refuses_an_unknown_token_a_forged_form_and_a_foreign_next(token_app, conn):
    browser = token_app.test_client()
    csrf = csrf_from(browser.get("/signin", headers=HTML).data)
    wrong = browser.post("/signin", data={"token": "not-a-token-0123456789", "csrf_token": csrf}, headers=HTML)
    assert wrong.status_code == 401 and b"Unknown token" in wrong.data
    forged = token_app.test_client().post("/signin", data={"token": TOKENS["alice"]}, headers=HTML)
    assert forged.status_code == 403  # no CSRF token: another site cannot sign a visitor in
    assert token_app.test_client().get("/", headers=HTML).status_code == 303
    for target in ("//evil.example/x", "https://evil.example/", "/\\evil.example", "/\t/evil.example", "/\n/evil.example"):
        answer = sign_in(token_app.test_client(), "alice", next_path=target)
        assert answer.status_code == 303 and answer.headers["Location"] == "/", target


def test_a_session_signs_out_when_its_token_is_removed(conn):
    old = create_app_with(LEASH_API_TOKENS=TOKEN_LIST)
    browser = old.test_client()
    sign_in(browser, "alice")
    assert browser.get("/", headers=HTML).status_code == 200
    rotated = create_app_with(LEASH_API_TOKENS="alice=a-brand-new-token-0123")
    cookie = browser.get_cookie("leash_session")
    later = rotated.test_client()
    later.set_cookie("leash_session", cookie.value)
    assert later.get("/", headers=HTML).status_code == 303


def test_a_browser_owner_from_before_sign_in_may_read_its_jobs_and_act_no_more(token_app, conn):
    mine = enqueue(conn, "classify", {"items": ["x"], "labels": ["a", "b"]}, owner="browser:legacy1")[0]
    browser = token_app.test_client()
    with browser.session_transaction() as session:
        session["owner"] = "browser:legacy1"
    assert browser.get(f"/jobs/{mine}").get_json()["state"] == "queued"
    assert [j["job_id"] for j in browser.get("/jobs").get_json()["jobs"]] == [mine]
    csrf = csrf_from(browser.get(f"/jobs/{mine}", headers=HTML).data)
    assert browser.post(f"/jobs/{mine}/cancel", headers={"X-CSRFToken": csrf}).status_code == 401
    assert browser.post("/jobs", json=CLASSIFY, headers={"X-CSRFToken": csrf}).status_code == 401
    assert browser.get("/", headers=HTML).status_code == 303
    assert conn.hget(keys.job(mine), "state") == b"queued" and len(conn.keys(keys.job("*"))) == 1


def test_the_trusted_header_signs_in_only_when_configured(conn):
    header = {"X-Forwarded-User": "carol@example.com"}
    ignored = create_app_with(LEASH_API_TOKENS=TOKEN_LIST).test_client()
    assert ignored.get("/", headers={**HTML, **header}).status_code == 303
    assert ignored.post("/jobs", json=CLASSIFY, headers=header).status_code == 401
    assert no_jobs(conn)

    proxied = create_app_with(LEASH_API_TOKENS=TOKEN_LIST, LEASH_TRUSTED_USER_HEADER="X-Forwarded-User").test_client()
    posted = submit_form(proxied, headers=header)
    assert posted.status_code == 303
    job_id = posted.headers["Location"].rsplit("/", 1)[1]
    assert conn.hget(keys.job(job_id), "owner") == b"carol@example.com"
    assert proxied.get(f"/jobs/{job_id}", headers=header).status_code == 200
    assert proxied.get(f"/jobs/{job_id}", headers={"X-Forwarded-User": "dave"}).status_code == 404
    # Authenticated by the proxy's cookie: a change still needs our CSRF token.
    forged = proxied.post(f"/jobs/{job_id}/cancel", headers=header)
    assert forged.status_code == 403 and conn.hget(keys.job(job_id), "state") == b"queued"
    bad = proxied.get("/jobs", headers={"X-Forwarded-User": "carol smith"})
    assert bad.status_code == 400 and "X-Forwarded-User" in bad.get_json()["error"]
    # Without the header the proxy's app is as closed as any.
    assert create_app_with(LEASH_TRUSTED_USER_HEADER="X-Forwarded-User").test_client().get("/", headers=HTML).status_code == 303


@pytest.mark.parametrize("public", [False, True])
def test_the_public_form_is_an_explicit_opt_in(conn, public):
    app = create_app_with(LEASH_API_TOKENS=TOKEN_LIST, LEASH_PUBLIC_SUBMIT=public)
    visitor = app.test_client()
    if not public:
        assert visitor.get("/", headers=HTML).status_code == 303
        assert no_jobs(conn)
        return
    posted = submit_form(visitor)
    assert posted.status_code == 303
    job_path = posted.headers["Location"]
    job_id = job_path.rsplit("/", 1)[1]
    assert conn.hget(keys.job(job_id), "owner") == b"public"
    assert visitor.get(job_path, headers=HTML).status_code == 200  # its page, by address
    csrf = csrf_from(visitor.get(job_path, headers=HTML).data)
    assert visitor.post(f"{job_path}/cancel", headers={"X-CSRFToken": csrf}).status_code == 401
    assert visitor.post("/jobs", json=CLASSIFY, headers={"X-CSRFToken": csrf}).status_code == 401  # form only
    assert visitor.get("/jobs", headers=HTML).status_code == 303  # no list of every visitor's jobs
    assert conn.hget(keys.job(job_id), "state") == b"queued"


def test_the_public_owner_is_under_the_same_quotas(conn, env):
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", "1")
    app = create_app_with(LEASH_API_TOKENS=TOKEN_LIST, LEASH_PUBLIC_SUBMIT=True)
    assert submit_form(app.test_client()).status_code == 303
    refused = submit_form(app.test_client(), submission="submission-2")
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "60"
    assert len(conn.keys(keys.job("*"))) == 1
