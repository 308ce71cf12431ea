"""The web app's settings, read one way: the typed groups of jobs/config, read once as the app
is made and kept on it (``current()`` in a request, ``of(app)`` while it is set up). Every
module of web/ reads its settings here; none reads Flask's ``app.config`` for one of leash's
or the environment. Flask's own keys (the cookie's secret, the body limit) are filled from
these in web/app.py.

SECRET_KEY is the one secret. LEASH_SECRET_KEY, its old name, still works when SECRET_KEY is
unset, and says once at start that it is deprecated."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace

from flask import Flask, current_app

from jobs.config import DECLARED, RedisSettings, Settings, overlay, redis_settings, settings
from jobs.config.front import WebApp, WebServer, web_app, web_server
from jobs.config.operations import Operations, operations
from jobs.core.store.connection import check_settings, configured_url
from jobs.read.owners import parse_tokens

log = logging.getLogger(__name__)

EXTENSION = "leash_settings"

#: The one line the web app (and ``leash web``) stops with outside ``leash dev``.
SECRET_KEY_MISSING = ("SECRET_KEY is not set; set it to a long random value shared by every web process, e.g. "
                      "heroku config:set SECRET_KEY=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")

LEASH_SECRET_KEY_DEPRECATED = ("LEASH_SECRET_KEY is deprecated and will be removed: set SECRET_KEY to the same "
                               "value instead (the browsers' sessions stay signed in)")
LEASH_SECRET_KEY_IGNORED = "LEASH_SECRET_KEY is ignored: SECRET_KEY is set, and it signs the sessions"


class SecretKeyMissing(RuntimeError):
    pass


@dataclass(frozen=True)
class AppSettings:
    """What one web app was made with."""

    web: WebApp
    server: WebServer
    redis: RedisSettings
    jobs: Settings
    operations: Operations
    #: REDIS_URL as set, its form checked (None: the default local Redis)
    redis_url: str | None
    #: the session secret: SECRET_KEY (or its deprecated alias), or a random one under ``leash dev``
    secret: str
    #: LEASH_API_TOKENS parsed: token -> owner
    tokens: dict[str, str]

    @property
    def production(self) -> bool:
        """Callers are told apart (tokens or an auth proxy): not an open development app."""
        return bool(self.tokens or self.web.trusted_user_header)

    @property
    def metrics_closed(self) -> bool:
        """/metrics is a 403: production, and neither a token nor LEASH_METRICS_PUBLIC=1."""
        return self.production and not self.web.metrics_token and not self.web.metrics_public


def read(overrides: Mapping[str, object] | None = None) -> AppSettings:
    """The settings from the environment, the declared variables in ``overrides`` read in its
    place (None: unset); a bad value is a ValueError naming it, no secret outside ``leash dev``
    ``SecretKeyMissing``."""
    with overlay(_as_text(overrides or {})):
        check_settings()  # a bad value anywhere: the app refuses to start, naming the variable
        web = web_app()
        found = AppSettings(web=web, server=web_server(), redis=redis_settings(), jobs=settings(),
                            operations=operations(), redis_url=configured_url(), secret="",
                            tokens=parse_tokens(web.api_tokens))
    return _with_secret(found)


def _with_secret(found: AppSettings) -> AppSettings:
    web = found.web
    if web.leash_secret_key and web.secret_key:
        if web.leash_secret_key != web.secret_key:
            log.warning(LEASH_SECRET_KEY_IGNORED)
    elif web.leash_secret_key:
        log.warning(LEASH_SECRET_KEY_DEPRECATED)
    secret = web.session_secret
    if not secret:
        if not web.dev:
            # A random key per process would forget browsers' sessions (their jobs) on every
            # restart and flip owners between processes: refuse instead.
            raise SecretKeyMissing(SECRET_KEY_MISSING)
        secret = secrets.token_urlsafe(32)  # leash dev: sessions last until it stops
    return replace(found, secret=secret)


def _as_text(overrides: Mapping[str, object]) -> dict[str, str | None]:
    """Overrides as the environment would spell them: only declared variables."""
    unknown = sorted(name for name in overrides if name not in DECLARED)
    if unknown:
        raise KeyError(f"not declared settings (jobs/config/declarations.py): {', '.join(unknown)}")
    text: dict[str, str | None] = {}
    for name, value in overrides.items():
        if value is None or isinstance(value, str):
            text[name] = value
        elif isinstance(value, bool):
            text[name] = "1" if value else "0"
        elif isinstance(value, Mapping):  # LEASH_API_TOKENS as {owner: token}
            text[name] = ",".join(f"{owner}={token}" for owner, token in value.items())
        else:
            text[name] = str(value)
    return text


def keep(app: Flask, found: AppSettings) -> None:
    app.extensions[EXTENSION] = found


def of(app: Flask) -> AppSettings:
    return app.extensions[EXTENSION]


def current() -> AppSettings:
    """The settings of the app serving this request."""
    return of(current_app)


@dataclass(frozen=True)
class ServerSettings:
    """What ``leash web`` reads around the app: its server's limits, read afresh."""

    server: WebServer
    max_body_bytes: int
    redis_timeout: float


def for_server() -> ServerSettings:
    return ServerSettings(server=web_server(), max_body_bytes=web_app().max_body_bytes,
                          redis_timeout=redis_settings().redis_timeout)
