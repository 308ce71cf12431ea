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
    """What the commands act as and point at; the defaults of the options that are settings
    (cli/option_defaults.py: ``--owner``, ``--port``, ...)."""

    web_url: str | None
    actor: str | None
    owner: str | None
    token: str | None
    port: int
    dev_workers: int
    user: str
    xdg_state_home: str | None


def command_line() -> CommandLine:
    return _read(CommandLine, {"user": "USER", "xdg_state_home": "XDG_STATE_HOME", "port": "PORT"})


@dataclass(frozen=True)
class WorkerCommand:
    """``leash worker``'s options that are settings (its queues, imports and log level are
    jobs.config's ``settings()`` and ``logs()``)."""

    burst: bool
    worker_name: str | None
    with_scheduler: bool


def worker_command() -> WorkerCommand:
    return _read(WorkerCommand)


@dataclass(frozen=True)
class AlertCommand:
    """``leash alert``'s options that are settings, for a scheduler that sets them once."""

    alert_window: str
    alert_max_failures: int | None
    alert_max_ratio: float | None
    alert_webhook: str | None
    alert_include_canceled: bool


def alert_command() -> AlertCommand:
    return _read(AlertCommand)
