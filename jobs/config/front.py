"""The settings only the web app, its server and the command line read, as typed groups like
jobs.config's (declared there with every other variable; nothing in jobs/ imports this)."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.config import _read


@dataclass(frozen=True)
class WebApp:
    secret_key: str | None
    leash_secret_key: str | None
    api_tokens: str
    dashboard_user: str | None
    dashboard_password: str | None
    max_body_bytes: int
    max_sessions: int
    secure_cookies: bool
    metrics_token: str | None
    metrics_public: bool
    trusted_user_header: str | None
    public_submit: bool
    guess_rate: str
    dev: bool
    prometheus_multiproc_dir: str | None

    @property
    def session_secret(self) -> str | None:
        """SECRET_KEY, the one secret; else LEASH_SECRET_KEY, its deprecated name (web/app_settings.py
        logs a line when it is the one read)."""
        return self.secret_key or self.leash_secret_key


def web_app() -> WebApp:
    return _read(WebApp, {"secret_key": "SECRET_KEY", "leash_secret_key": "LEASH_SECRET_KEY",
                          "prometheus_multiproc_dir": "PROMETHEUS_MULTIPROC_DIR"})


@dataclass(frozen=True)
class WebServer:
    """``leash web``: how many requests and connections it takes, and from whom."""

    web_threads: int
    web_connections: int
    web_connections_per_address: int
    web_request_deadline: float
    trusted_proxies: str | None


def web_server() -> WebServer:
    return _read(WebServer)


@dataclass(frozen=True)
class CommandLine:
    """What the commands act as and point at. (Options that are settings, such as ``leash alert``'s
    LEASH_ALERT_* and ``leash worker``'s, are read by click from their declared variable.)"""

    web_url: str | None
    actor: str | None
    user: str
    xdg_state_home: str | None


def command_line() -> CommandLine:
    return _read(CommandLine, {"user": "USER", "xdg_state_home": "XDG_STATE_HOME"})
