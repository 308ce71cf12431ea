"""One delivery attempt of a completion webhook: an RQ job of its own (``deliver``, whose dotted
path RQ stores in the jobs it keeps: it never moves), run by any worker of the job's queue.

The address is checked again (jobs/webhooks/addresses.py) and the connection goes to an address
that check returned. The body is the one the sweep built when the job ended, the same on every
attempt; the timestamp and signature are the attempt's. A 2xx answer delivers it; anything else
(another status, a refused address, a timeout, no connection) is recorded (in the job's record,
and in the archive's ``leash_webhook_deliveries`` when there is one) and raised, and RQ's
``Retry`` brings the delivery back after the next LEASH_WEBHOOK_BACKOFF interval (its scheduler,
which every ``leash worker`` runs), until every interval has been waited. Redirects are not
followed (a 3xx is not a delivery)."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from rq import get_current_job

from jobs.config.webhook_settings import webhooks
from jobs.core import clock
from jobs.errors import InvalidJob, LeashError
from jobs.lifecycle import transitions
from jobs.webhooks import addresses, signing

log = logging.getLogger("leash.webhooks")

#: Attempts kept in the job's record (the count is kept whole), and the characters of each one's
#: error: the record is read by every poll (a webhook adds at most about 1.5 KB to it).
LOG_KEPT = 5
ERROR_CHARS = 90
#: The most of an answer read (and dropped): enough to let the receiver finish its reply.
READ_BYTES = 65536
USER_AGENT = "leash-webhooks"
#: Seconds one attempt may take to connect, and then between the bytes of the answer.
TIMEOUT = 10.0


class NotDelivered(LeashError):
    """The webhook was not delivered by this attempt; RQ tries again after the backoff."""


def attempt_once(url: str, delivery_id: str, body: str) -> tuple[int | None, str | None]:
    """One signed POST of ``body`` to ``url``, its address checked again first: the HTTP status
    (None when no answer came) and what went wrong (None when the receiver took it, a 2xx)."""
    settings = webhooks()
    status, error = None, None
    try:
        target = addresses.check(url, settings.webhook_allow_private)
        status = post(target, signing.headers(settings.webhook_secret, delivery_id, int(time.time()), body),
                      body, TIMEOUT)
        if not 200 <= status < 300:
            error = f"HTTP {status}"
    except InvalidJob as exc:
        error = str(exc)
    except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return status, error


def deliver(job_id: str, delivery_id: str, url: str, body: str) -> str:
    """Send the webhook once; returns "delivered", raises NotDelivered otherwise."""
    rq_job = get_current_job()
    started = clock.wall()
    status, error = attempt_once(url, delivery_id, body)
    retries_left = rq_job.retries_left if rq_job is not None else 0
    attempt = len(rq_job.retry_intervals or []) - (retries_left or 0) + 1 if rq_job is not None else 1
    state = "delivered" if error is None else ("pending" if retries_left else "given up")
    entry = {"attempt": attempt, "status": status, "at": clock.iso(started),
             "seconds": round(clock.wall() - started, 3), "error": error[:ERROR_CHARS] if error else None}
    connection = rq_job.connection if rq_job is not None else None
    if connection is not None:
        transitions.webhook(connection, job_id, ["attempt", delivery_id, json.dumps(entry), state, LOG_KEPT])
        _to_archive(connection, job_id, delivery_id, entry)
    if error is not None:
        raise NotDelivered(f"webhook {delivery_id} of job {job_id}, attempt {attempt}: {error}")
    return state


#: Where an attempt is also written: ``(connection, job_id, delivery_id, entry)``, the archive's
#: ``leash_webhook_deliveries`` (jobs/archive/webhook_log.py). Handed down by ``leash worker`` as it
#: starts (jobs/worker/leash_worker.py), since the webhooks sit below the archive's engine; None:
#: the job's record only.
to_archive: Callable[[Any, str, str, dict], Any] | None = None


def _to_archive(connection, job_id: str, delivery_id: str, entry: dict) -> None:
    """The attempt in the archive too, when there is one: kept past the record's short log. The
    delivery stands whatever the archive says (archiving the job writes what its record holds)."""
    if to_archive is None:
        return
    try:
        to_archive(connection, job_id, delivery_id, entry)
    except Exception as exc:  # noqa: BLE001 - an archive that cannot be reached or migrated: logged, not raised
        log.warning("webhook %s of job %s: attempt not written to the archive: %s", delivery_id, job_id,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def post(target: addresses.Target, headers: dict[str, str], body: str, timeout: float) -> int:
    """POST ``body`` to the target at one of its checked addresses (the next if one cannot be
    reached); returns the answer's status."""
    failure: Exception = OSError("no address")
    host = target.host if target.port in (80, 443) else f"{target.host}:{target.port}"
    for address in target.addresses:
        connection = _pinned(target, address, timeout)
        try:
            connection.request("POST", target.path, body=body.encode(),
                               headers={**headers, "Host": host, "User-Agent": USER_AGENT})
            answer = connection.getresponse()
            answer.read(READ_BYTES)
            return answer.status
        except ConnectionRefusedError as exc:
            failure = exc
        finally:
            connection.close()
    raise failure


class _PinnedHTTP(http.client.HTTPConnection):
    """An HTTP connection to one checked address, under the URL's host name (the Host header)."""

    def __init__(self, target: addresses.Target, address: str, timeout: float):
        super().__init__(target.host, target.port, timeout=timeout)
        self.address = address

    def connect(self):
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """The same over TLS: the host name for SNI and the certificate check, the address to connect to."""

    def __init__(self, target: addresses.Target, address: str, timeout: float):
        super().__init__(target.host, target.port, timeout=timeout, context=ssl.create_default_context())
        self.address = address

    def connect(self):
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def _pinned(target: addresses.Target, address: str, timeout: float) -> http.client.HTTPConnection:
    return (_PinnedHTTPS if target.scheme == "https" else _PinnedHTTP)(target, address, timeout)
