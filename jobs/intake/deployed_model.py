"""The model settings of the deployment that runs a queue's jobs, as its workers publish them.

A dry run and the estimate a job keeps depend on the model (which backend, which model, its
price, how many tokens an answer may take). Those are the settings of the workers that will run
the job, not of the terminal that typed ``leash submit``: a second terminal without the model's
variables would otherwise price a gpt-4o-mini job with the offline ``local`` backend, at $0.

Each worker writes the settings below (``PUBLISHED``: no API key, no secret; a URL's user and
password are left out) to one key per queue it serves, when it starts and then on its
heartbeat, with an expiry (``TTL_SECONDS``): a queue no worker has served for that long has
none. ``priced_with`` reads them for a submission's queue, and for the time of the pricing the
settings are read from them instead of this process's environment (jobs.config.overlay). With
none published, the process's own settings are used and the estimate says so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

from redis import Redis

from jobs import config, keys
from jobs.core import clock

log = logging.getLogger(__name__)

#: The settings a worker publishes: what the price of a job and its requests depend on.
PUBLISHED = ("LEASH_MODEL_BACKEND", "LEASH_MODEL_URL", "LEASH_MODEL_NAME", "LEASH_MODEL_TEMPERATURE",
             "LEASH_MODEL_MAX_TOKENS", "LEASH_MODEL_STRUCTURED_OUTPUT", "LEASH_MODEL_PRICES")
#: How long a published entry lives without a worker writing it again.
TTL_SECONDS = 120
#: How often a worker writes it again (its heartbeat runs more often).
EVERY_SECONDS = 30.0


def _without_credentials(url: str | None) -> str | None:
    if not url or "@" not in url:
        return url
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def own() -> dict[str, str | None]:
    """This process's published settings, as set (None: unset)."""
    values = {name: config.raw(name) for name in PUBLISHED}
    values["LEASH_MODEL_URL"] = _without_credentials(values["LEASH_MODEL_URL"])
    return values


def describe(values: dict[str, str | None]) -> str:
    """The model the settings name, in words: ``gpt-4o-mini via openai`` or ``local``."""
    backend = values.get("LEASH_MODEL_BACKEND") or ("openai" if values.get("LEASH_MODEL_URL") else "local")
    if backend == "local":
        return "local (the offline backend)"
    where = f" at {values['LEASH_MODEL_URL']}" if values.get("LEASH_MODEL_URL") else ""
    return f"{values.get('LEASH_MODEL_NAME') or '(no model name)'} via {backend}{where}"


def publish(connection: Redis, queues: list[str], worker: str, now: float | None = None) -> None:
    """Write this worker's model settings for each queue it serves (see the module's docstring)."""
    now = clock.wall() if now is None else now
    entry = json.dumps({"settings": own(), "worker": worker, "at": now}, separators=(",", ":"))
    with connection.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.set(keys.model_settings(queue), entry, ex=TTL_SECONDS)
        pipe.execute()


def published(connection: Redis, queue: str) -> dict | None:
    """What a worker of ``queue`` published last (``settings``, ``worker``, ``at``), or None."""
    raw = connection.get(keys.model_settings(queue))
    if not raw:
        return None
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("settings"), dict):
        return None
    entry["settings"] = {name: entry["settings"].get(name) for name in PUBLISHED}
    return entry


@contextmanager
def priced_with(connection: Redis, queue: str) -> Iterator[str]:
    """Within it, the model settings are those the workers of ``queue`` published (this
    process's own when none did); yields a line saying which."""
    entry = published(connection, queue)
    if entry is None:
        yield (f"no worker of queue {queue!r} has published its model settings; priced with this process's: "
               f"{describe(own())}")
        return
    with config.overlay(entry["settings"]):
        yield f"priced with the model settings of the workers of queue {queue!r}: {describe(entry['settings'])}"
