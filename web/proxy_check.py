"""``LEASH_TRUSTED_PROXIES=*`` trusts every peer's ``X-Forwarded-For``: right behind a platform
router that is the app's only way in (it sets the header on every request), spoofable by anyone
who reaches the app another way — each request could then name a new client address, and the
guessing limits would count nothing. A request that arrives without the header is the sign of
such a way in: it is logged (once per process) and noted in Redis (at most once a minute per
process, jobs/observability/direct_requests.py) for ``leash doctor`` to warn about. The platform's own health
checks (/healthz, /readyz) may come without it and are not counted."""

from __future__ import annotations

import logging
import time

import redis
from flask import Flask, current_app, request

from jobs.observability import direct_requests

from . import app_settings

log = logging.getLogger(__name__)

#: Seconds between two notes of one process.
NOTE_EVERY = 60
PROBES = ("/healthz", "/readyz")


def watch(app: Flask) -> None:
    if (app_settings.of(app).server.trusted_proxies or "").strip() != "*":
        return
    last = {"at": 0.0, "logged": False}

    def check() -> None:
        if "X-Forwarded-For" in request.headers or request.path in PROBES:
            return
        now = time.time()
        if now - last["at"] < NOTE_EVERY:
            return
        last["at"] = now
        if not last["logged"]:
            last["logged"] = True
            log.warning("a request from %s came without X-Forwarded-For while LEASH_TRUSTED_PROXIES=*: the app "
                        "is reachable other than through the platform's router, and there any client can name "
                        "its own address (set LEASH_TRUSTED_PROXIES to the router's address)", request.remote_addr)
        try:
            direct_requests.note(current_app.extensions["leash_redis"], now, request.remote_addr or "",
                                 request.path)
        except redis.RedisError:  # a note for doctor is never worth failing a request over
            pass

    app.before_request(check)
