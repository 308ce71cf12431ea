"""The web process (``leash web``, the Procfile's ``web:`` line): waitress serving the Flask app.

Why waitress, and why these settings (figures in docs/BENCHMARKS.md, "Slow clients"):

- Its main loop reads every request whole — request line, headers and body — before an app
  thread sees it. A client that sends a byte a second holds one socket, never one of the
  ``LEASH_WEB_THREADS`` threads; gunicorn's gthread workers (the server before) gave each such
  client a thread, and 16 of them stopped the whole app.
- ``max_request_body_size`` is the body limit (``LEASH_MAX_BODY_BYTES``), counted while the
  body arrives: a chunked body over it is a 413 from the server itself, before any thread.
- ``connection_limit`` bounds the sockets it holds (``LEASH_WEB_CONNECTIONS``; by default as
  many as the open-file limit allows); poll() instead of select() lets it pass 1024 file
  descriptors, and the soft descriptor limit is raised to fit.
- web/server_guard.py's subclasses add a cap on one address's connections, a deadline for a
  whole request, bounds on chunks and header lines, JSON refusals, and a lingering close.
- One process with many threads: what one thread learns (a Redis stall, web/redis_guard.py)
  every thread knows at once, and /metrics counts every request without multiprocess files.
  The web app spends its time waiting on Redis, not computing, so one process is enough; run
  more dynos (or instances) for more.
"""

from __future__ import annotations

import logging
import resource
import signal
import sys
import threading
import time

from jobs.observability import logs

from . import app_settings

log = logging.getLogger(__name__)

#: Request line plus headers; gunicorn's limits (8 KB a header, 100 of them) are of this order.
MAX_HEADER_BYTES = 64 * 1024
#: A connection that sends nothing for this long is closed. Longer than the idle time Heroku's
#: router and nginx keep a connection to the app (so they close first), short enough that
#: silent sockets do not pile up.
CHANNEL_TIMEOUT = 120
#: Descriptors kept free beyond the connections: Redis sockets, temp files of large bodies, logs.
SPARE_DESCRIPTORS = 64
#: After SIGTERM, how long requests already received may take to be answered: inside Heroku's
#: 30 s before SIGKILL, and longer than LEASH_REDIS_TIMEOUT's default wait.
SHUTDOWN_GRACE = 20


#: LEASH_WEB_CONNECTIONS=0 (the default): as many as the open-file limit allows, at most this.
MAX_AUTO_CONNECTIONS = 10_000


def _descriptors_for(connections: int) -> int:
    """Raise the soft limit on open files towards what ``connections`` needs (at most the hard
    limit; 0: all of it, up to MAX_AUTO_CONNECTIONS); returns how many connections fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if connections <= 0:
        connections = MAX_AUTO_CONNECTIONS if hard == resource.RLIM_INFINITY else \
            max(10, min(MAX_AUTO_CONNECTIONS, hard - SPARE_DESCRIPTORS))
    wanted = connections + SPARE_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new_soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
        soft = new_soft
    return connections if soft == resource.RLIM_INFINITY else max(1, min(connections, soft - SPARE_DESCRIPTORS))


def waitress_options(host: str, port: int) -> dict:
    found = app_settings.for_server()
    connections = _descriptors_for(found.server.web_connections)
    return {
        "host": host,
        "port": port,
        "threads": found.server.web_threads,
        "connection_limit": connections,
        "asyncore_use_poll": True,  # select() cannot watch descriptors above 1024
        "channel_timeout": CHANNEL_TIMEOUT,
        "max_request_header_size": MAX_HEADER_BYTES,
        "max_request_body_size": found.max_body_bytes,
        # X-Forwarded-* from anyone would let a client choose the scheme and host the app sees.
        "clear_untrusted_proxy_headers": True,
        "ident": "leash",
        **_proxy_options(),
    }


def guard_options() -> dict:
    """web/server_guard.py's limits: no per-address cap behind a trusted proxy (every connection
    is the proxy's)."""
    server = app_settings.for_server().server
    behind_proxy = bool((server.trusted_proxies or "").strip())
    return {"per_address_cap": 0 if behind_proxy else server.web_connections_per_address,
            "request_deadline": server.web_request_deadline}


def _proxy_options() -> dict:
    """LEASH_TRUSTED_PROXIES: the proxy (or ``*``: whatever connects, as behind Heroku's router)
    whose last X-Forwarded-For hop is the client's address (REMOTE_ADDR) and whose
    X-Forwarded-Proto is the scheme; waitress applies them and drops the headers otherwise."""
    trusted = (app_settings.for_server().server.trusted_proxies or "").strip()
    if not trusted:
        return {}
    return {"trusted_proxy": trusted, "trusted_proxy_count": 1,
            "trusted_proxy_headers": {"x-forwarded-for", "x-forwarded-proto"}}


def _schema_refusal() -> str | None:
    """Check (and migrate) the layout Redis holds before serving; the reason not to start, if
    any. A Redis away at start is not one: the app answers 503 until it is back."""
    import redis

    from jobs.core.store import schema
    from jobs.core.store.connection import connect

    connection = connect(socket_timeout=app_settings.for_server().redis_timeout)
    try:
        schema.ensure(connection)
    except schema.SchemaTooNew as exc:
        return str(exc)
    except redis.exceptions.RedisError as exc:
        log.warning("Redis did not answer the schema check at start (%s); serving 503 until it does", exc)
    finally:
        connection.close()
    return None


def serve(host: str, port: int, log_level: str = "INFO") -> int:
    """Run until stopped; a missing secret is one line on stderr and exit status 1, a malformed
    setting one line and exit status 2."""
    from . import server_guard
    from .app import SecretKeyMissing, create_app

    try:
        logs.configure(log_level)  # waitress's own lines too, as text or JSON (LEASH_LOG_FORMAT)
        app = create_app()
    except SecretKeyMissing as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    except ValueError as exc:  # a malformed setting (LEASH_API_TOKENS, LEASH_LOG_FORMAT, ...), named
        sys.stderr.write(f"{exc}\n")
        return 2
    refusal = _schema_refusal()
    if refusal:
        sys.stderr.write(f"{refusal}\n")
        return 2
    options = waitress_options(host, port)
    wanted = app_settings.of(app).server.web_connections
    if options["connection_limit"] < wanted:
        log.warning("the open-file limit allows %d connections, not LEASH_WEB_CONNECTIONS=%d",
                    options["connection_limit"], wanted)
    server = server_guard.create_server(app, options, **guard_options())
    server.print_listen("Serving on http://{}:{}")
    _run_until_stopped(server)
    return 0


def _run_until_stopped(server) -> None:
    """waitress's loop, until SIGTERM (a deploy) or SIGINT; then stop accepting and answer the
    requests already received, for at most ``SHUTDOWN_GRACE`` seconds. waitress alone, stopped,
    closes every connection at once, with answers its threads have written still unsent."""
    from waitress import wasyncore

    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    tick = server.adj.asyncore_loop_timeout
    sockets = server._map  # the loop's map of sockets (TcpWSGIServer's own attribute)
    while not stopping.is_set():
        wasyncore.loop(timeout=tick, map=sockets, use_poll=True, count=1)
    wasyncore.dispatcher.close(server)  # the listening socket only: its wake-up pipe stays
    deadline = time.monotonic() + SHUTDOWN_GRACE
    while _answering(sockets) and time.monotonic() < deadline:
        wasyncore.loop(timeout=0.05, map=sockets, use_poll=True, count=1)
    server.task_dispatcher.shutdown(timeout=1)
    wasyncore.close_all(sockets)


def _answering(sockets: dict) -> bool:
    """A request received whole and not yet answered, or an answer not yet sent. A request still
    arriving (a slow client) does not hold the shutdown."""
    from waitress.channel import HTTPChannel

    return any(isinstance(channel, HTTPChannel) and (channel.requests or channel.total_outbufs_len)
               for channel in list(sockets.values()))
