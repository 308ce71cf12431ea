"""Log lines for people or for machines.

``LEASH_LOG_FORMAT=text`` (the default) prints ``time logger LEVEL message``.
``LEASH_LOG_FORMAT=json`` prints every line of the web app (the web server's own lines too) and of the
worker (its work-horses and scheduler too) as one JSON object, through python-json-logger::

    {"level": "INFO", "logger": "rq.worker", "message": "...", "time": "2026-01-31T12:00:00.123456+00:00",
     "job_id": "...", "attempt": 2, "kind": "classify", "owner": "alice"}

``job_id``, ``attempt``, ``kind`` and ``owner`` are there whenever a line is about a job: in a
worker while it runs an attempt, in the web app while a request names a job or an owner.
The same context tags errors sent to Sentry (``jobs.observability.reporting``).

Every line leaves with the credentials of any URL in it masked (``redis://:***@host``,
``http://user:***@host``, ``?api_key=***``): a model URL or ``REDIS_URL`` with a password,
named in an error or a traceback, never reaches the log. The HTTP clients' one line per call
(httpx2, which the openai and anthropic SDKs use, httpx, and the SDKs' own) is off unless
``LEASH_LOG_HTTP_CALLS=1``.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable

from jobs import config

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
CONTEXT_FIELDS = ("job_id", "attempt", "kind", "owner")

#: Functions returning what the current line is about (a dict with some CONTEXT_FIELDS).
#: The worker adds the attempt it runs (jobs/worker/leash_worker.py); the web app its request
#: (web/request_logs.py).
_providers: list[Callable[[], dict]] = []


def log_format() -> str:
    value = config.logs().log_format.strip().lower()
    if value not in FORMATS:
        raise ValueError(f"LEASH_LOG_FORMAT must be one of {', '.join(FORMATS)}, got {value!r}")
    return value


def add_context_provider(provider: Callable[[], dict]) -> None:
    if provider not in _providers:
        _providers.append(provider)


def job_context() -> dict:
    """What the current line (or error) is about; never raises, never waits long."""
    context: dict = {}
    for provider in _providers:
        try:
            found = provider()
        except Exception:  # context is a nicety: it must never cost a log line
            continue
        for name, value in found.items():
            if value not in (None, "") and name not in context:
                context[name] = value
    return context


def attempt_context(attempt) -> dict:
    """What a line written while ``attempt`` runs is about (the worker's context provider)."""
    if attempt is None:
        return {}
    return {"job_id": attempt.job_id, "attempt": attempt.number, "kind": attempt.kind, "owner": _owner(attempt)}


def _owner(attempt) -> str | None:
    """The job's owner, read once per attempt and process (one HGET) and kept on the attempt."""
    if "owner" not in attempt.extra:
        attempt.extra["owner"] = None  # set first: the read below may log, and must not recurse
        import redis

        from jobs import keys

        try:
            raw = attempt.connection.hget(keys.job(attempt.job_id), "owner")
        except redis.exceptions.RedisError:
            return None
        attempt.extra["owner"] = raw.decode() if isinstance(raw, bytes) else raw
    return attempt.extra["owner"]


class JobContextFilter(logging.Filter):
    """Adds job_id / attempt / kind / owner to a record when the line is about a job."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in job_context().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


#: Extra fields of other libraries' lines left out: RQ attaches a failed job's whole payload
#: (up to LEASH_MAX_BODY_BYTES) to its error line; the job id identifies it.
LEFT_OUT = ("arguments", "kwargs")


def json_formatter() -> logging.Formatter:
    from pythonjsonlogger.core import RESERVED_ATTRS
    from pythonjsonlogger.json import JsonFormatter

    # timestamp="time": ISO 8601 in UTC, e.g. 2026-01-31T12:00:00.123456+00:00
    return JsonFormatter("{levelname}{name}{message}", style="{", timestamp="time",
                         rename_fields={"levelname": "level", "name": "logger"},
                         reserved_attrs=[*RESERVED_ATTRS, *LEFT_OUT])


#: The userinfo of a URL (``scheme://user:password@`` or ``scheme://token@``).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^\s/?#@:'\"<>]*)(:[^\s/?#@'\"<>]*)?@")
#: Query parameters that carry a secret.
_SECRET_PARAMS = re.compile(r"(?i)([?&](?:api[_-]?key|key|token|access_token|password|secret|signature|sig)=)"
                            r"[^&\s'\"<>#]+")
MASK = "***"


def mask_credentials(text: str) -> str:
    """``text`` with every URL's password (or lone user token) and secret query values masked."""
    def userinfo(match: re.Match) -> str:
        scheme, user, password = match.groups()
        return f"{scheme}{MASK}@" if password is None else f"{scheme}{user}:{MASK}@"

    return _SECRET_PARAMS.sub(rf"\1{MASK}", _USERINFO.sub(userinfo, text))


class MaskingStreamHandler(logging.StreamHandler):
    """Masks credentials in the whole formatted line: the message, its arguments, a traceback,
    extra fields of a JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_credentials(super().format(record))


#: Loggers that write one INFO line per HTTP call (with the whole URL).
HTTP_CLIENT_LOGGERS = ("httpx", "httpx2", "httpcore", "openai", "anthropic", "urllib3")


def quiet_http_clients() -> None:
    """The HTTP clients' per-call lines at WARNING, unless LEASH_LOG_HTTP_CALLS=1."""
    level = logging.NOTSET if config.logs().log_http_calls else logging.WARNING
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(level)


class OneLineFormatter(logging.Formatter):
    """A traceback becomes its last line, appended: ``... failed (ModelUnavailable: ...)``.
    For ``leash dev``'s terminal, where an expected failure (a model server down) is one line;
    ``leash dev -v`` and every deployed process keep whole tracebacks."""

    def format(self, record: logging.LogRecord) -> str:
        if not record.exc_info or record.exc_info[1] is None:
            return self._one_line(super().format(record))
        exc = record.exc_info[1]
        short = logging.makeLogRecord(record.__dict__)
        short.exc_info, short.exc_text, short.stack_info = None, None, None
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{super().format(short)} ({type(exc).__name__}: {first})"

    @staticmethod
    def _one_line(line: str) -> str:
        """A traceback inside the message itself (RQ's ``exception raised while executing``
        passes it as an argument, not as exc_info): the first line, then the traceback's last."""
        head, found, trace = line.partition("\nTraceback (most recent call last):")
        if not found:
            return line
        last = next((part.strip() for part in reversed(trace.splitlines()) if part.strip()), "")
        return f"{head.splitlines()[0] if head else ''} ({last})" if last else head


def make_handler(fmt: str, stream=None, tracebacks: bool = True) -> logging.Handler:
    handler = MaskingStreamHandler(stream or sys.stderr)
    handler.addFilter(JobContextFilter())
    text = logging.Formatter(TEXT_FORMAT) if tracebacks else OneLineFormatter(TEXT_FORMAT)
    handler.setFormatter(json_formatter() if fmt == "json" else text)
    handler._leash = True  # type: ignore[attr-defined]
    return handler


def configure(level: str | int = "INFO", fmt: str | None = None, tracebacks: bool = True) -> None:
    """Send every logger's lines to stderr in the chosen format (replacing an earlier call's
    handler, so calling it twice never doubles lines); ``tracebacks=False``: one line each."""
    fmt = fmt or log_format()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_leash", False)]:
        root.removeHandler(handler)
    root.addHandler(make_handler(fmt, tracebacks=tracebacks))
    root.setLevel(level.upper() if isinstance(level, str) else level)
    quiet_http_clients()


def configure_web() -> None:
    """For the web app: JSON lines when asked and nobody (``leash web``) has set logging up.
    Plain text leaves logging as the server has it."""
    if log_format() == "json" and not logging.getLogger().handlers:
        configure("INFO", "json")
