"""The web app's settings, read one way (web/app_settings.py): SECRET_KEY is the one secret,
LEASH_SECRET_KEY its deprecated name; a test sets a setting as the environment would, and
only a declared one."""

from __future__ import annotations

import logging

import pytest

from tests.web_support import create_app_with
from web import app_settings

DEPRECATED = "LEASH_SECRET_KEY is deprecated"


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "web.app_settings" and r.levelno == logging.WARNING]


def test_secret_key_signs_the_sessions_and_says_nothing(conn, caplog):
    caplog.set_level(logging.WARNING)
    app = create_app_with(SECRET_KEY="the-one-secret")
    assert app.config["SECRET_KEY"] == app_settings.of(app).secret == "the-one-secret"
    assert _warnings(caplog) == []


def test_leash_secret_key_alone_still_signs_and_logs_one_deprecation_line(conn, caplog):
    caplog.set_level(logging.WARNING)
    app = create_app_with(SECRET_KEY=None, LEASH_SECRET_KEY="the-old-name")
    assert app.config["SECRET_KEY"] == "the-old-name"
    said = _warnings(caplog)
    assert len(said) == 1 and said[0].startswith(DEPRECATED) and "set SECRET_KEY" in said[0]
    client = app.test_client()  # the sessions it signs work: the shared owner's browser keeps its cookie
    assert client.get("/jobs", headers={"Accept": "text/html"}).status_code == 200
    assert client.get_cookie("leash_session") is not None


def test_with_both_set_secret_key_signs_and_a_different_old_one_is_named_ignored(conn, caplog):
    caplog.set_level(logging.WARNING)
    app = create_app_with(SECRET_KEY="the-one-secret", LEASH_SECRET_KEY="another")
    assert app.config["SECRET_KEY"] == "the-one-secret"
    assert _warnings(caplog) == [app_settings.LEASH_SECRET_KEY_IGNORED]
    caplog.clear()
    create_app_with(SECRET_KEY="same", LEASH_SECRET_KEY="same")
    assert _warnings(caplog) == []


def test_settings_are_read_once_as_the_app_is_made(conn, monkeypatch):
    monkeypatch.setenv("LEASH_PUBLIC_SUBMIT", "1")
    app = create_app_with(LEASH_API_TOKENS="alice=alice-token-0123456789")
    monkeypatch.setenv("LEASH_PUBLIC_SUBMIT", "0")
    found = app_settings.of(app)
    assert found.web.public_submit is True and found.tokens == {"alice-token-0123456789": "alice"}
    with app.test_request_context("/"):
        assert app_settings.current() is found


def test_a_test_may_set_only_declared_settings(conn):
    with pytest.raises(KeyError, match="LEASH_NO_SUCH_THING"):
        create_app_with(LEASH_NO_SUCH_THING="1")
    with pytest.raises(ValueError, match="LEASH_MAX_BODY_BYTES must be an integer"):
        create_app_with(LEASH_MAX_BODY_BYTES="lots")


@pytest.mark.parametrize(("credentials", "linked"), [({}, False), (
    {"LEASH_DASHBOARD_USER": "ops", "LEASH_DASHBOARD_PASSWORD": "a-long-dashboard-password"}, True)])
def test_the_pages_link_the_queue_dashboard_only_where_it_is_mounted(conn, credentials, linked):
    page = create_app_with(**credentials).test_client().get("/", headers={"Accept": "text/html"})
    assert page.status_code == 200
    assert ('<a href="/rq/">Queue dashboard</a>' in page.get_data(as_text=True)) is linked
