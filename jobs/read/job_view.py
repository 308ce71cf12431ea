"""What a job's page (and ``leash status``) adds to its status fields for a person: which
attempt began a replay, timing and speed counted from the latest start, and a batch job's
details at its provider. From what the job page's one read returned (jobs/read/job_page.py):
the job hash's latest-attempt fields, and the batch record (keys.provider_batches) of a batch
job.

    attempts      the history, each entry with ``replay``: True where a replay started the count
                  again (attempts read 1, 2, 3, 1: the second 1 is marked)
    run           {started_at, elapsed_seconds, items_per_second, replayed}: elapsed from the
                  latest run's first start (after the last replay; the first start otherwise);
                  items/s over the latest attempt's own items
    batch         {ids, created_at, cancel_at, answered, failed, total, next_look_at, ended,
                  direct, can_look_now}
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jobs.archive import reading, webhook_log
from jobs.config import batches
from jobs.core import clock

#: How a give-back ends an attempt without counting one: the next start keeps its number.
_NOT_COUNTED = ("handed off", "deferred")


def _ts(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


def marked_attempts(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history with ``replay`` on each attempt that a replay started: its number is not
    above the one before, and the one before was not handed back uncounted."""
    out = []
    for n, entry in enumerate(history):
        before = history[n - 1] if n else None
        replay = bool(before and isinstance(entry.get("attempt"), int) and isinstance(before.get("attempt"), int)
                      and (entry["attempt"] < before["attempt"]
                           or (entry["attempt"] == before["attempt"] and before.get("ended") not in _NOT_COUNTED)))
        out.append(dict(entry, replay=replay))
    return out


def run_timing(fields: dict[str, Any], attempts: list[dict[str, Any]], job_hash: dict[str, str],
               now: float | None = None) -> dict[str, Any]:
    """Elapsed time and speed of the job's latest run (since its last replay): elapsed up to its
    end, or up to now while it runs or waits (a batch job at its provider does not update its
    hash while it waits, so "up to the last update" would read 0 s beside "started 17 s ago")."""
    now = clock.wall() if now is None else now
    replays = [n for n, a in enumerate(attempts) if a["replay"]]
    run_start = _ts(attempts[replays[-1]]["started_at"]) if replays else _ts(fields.get("started_at"))
    terminal = fields["state"] in ("succeeded", "failed")
    until = (_ts(fields.get("finished_at")) or _ts(fields.get("updated_at")) or now) if terminal else now
    elapsed = max(0.0, until - run_start) if run_start is not None else None
    rate = fields.get("items_per_second")
    if replays and terminal:
        started, at_start = job_hash.get("started_at"), job_hash.get("done_at_start")
        started = float(started) if started else None
        progressed = fields["done"] - int(at_start or 0)
        rate = progressed / max(until - started, 1e-3) if started is not None and progressed > 0 else None
    return {"started_at": clock.iso(run_start), "elapsed_seconds": round(elapsed, 1) if elapsed is not None else None,
            "items_per_second": round(rate, 3) if rate is not None else None, "replayed": bool(replays)}


def batch_details(fields: dict[str, Any], raw: dict[str, str]) -> dict[str, Any] | None:
    """A batch job's details at its provider (``raw``: its batch record, keys.provider_batches),
    or None for a direct job. Once the job has ended, the requests the provider answered are the
    items it stored minus those asked directly."""
    batch = fields.get("batch")
    if not batch:
        return None
    ids = [raw[name] for name in sorted((k for k in raw if k.startswith("id:")), key=lambda k: int(k[3:]))]
    first_at = float(raw["first_at"]) if raw.get("first_at") else None
    ended = fields["state"] in ("succeeded", "failed")
    direct = batch["direct"]
    answered = batch["done"]
    total = batch["total"]
    if ended:
        answered = max(answered, fields["done"] - direct)
        total = max(total, answered + batch["failed"])
    return {"ids": ids, "created_at": clock.iso(first_at),
            "cancel_at": clock.iso(first_at + batches().batch_max_wait) if first_at and not ended else None,
            "answered": answered, "failed": batch["failed"], "total": total, "direct": direct,
            "next_look_at": batch.get("next_look_at"), "ended": ended,
            "can_look_now": batch.get("phase") == "waiting"}


def cost_per_request(fields: dict[str, Any], answered: int) -> float | None:
    """What one answered request cost on average (None when the cost is unknown)."""
    cost = fields.get("cost_usd")
    if cost is None or not answered:
        return None
    return cost / answered


def with_every_webhook_attempt(connection, job_id: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The status fields with every attempt of the job's webhook: the record keeps the last few
    (jobs/webhooks/delivery.py's LOG_KEPT); when it counts more, the archive's
    ``leash_webhook_deliveries`` has them all (read only then: one query). An archive that does not
    answer leaves the record's."""
    hook = fields.get("webhook")
    if not hook or not hook.get("id") or int(hook.get("attempts") or 0) <= len(hook.get("deliveries") or []):
        return fields
    try:
        kept = webhook_log.read(reading.engine_for(connection), job_id, hook["id"])
    except Exception:  # noqa: BLE001 - an archive that cannot be reached or migrated: the record's log
        return fields
    if len(kept) > len(hook.get("deliveries") or []):
        hook["deliveries"] = kept
    return fields
