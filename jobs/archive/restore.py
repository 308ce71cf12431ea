"""An archived job back in Redis, for a replay: its payload copy (items included), its stored
results (the checkpoints a replay keeps) and its usage, read from the archive once Redis' copy
has left (after LEASH_REDIS_KEEP); and, first, its record (``records``) once Redis lost that too.

A replay needs them: RQ's record is rebuilt from the payload copy, and the items already
answered are not asked again. The keys come back with the keep time as their expiry; the
replay itself makes them persistent (replay_v4), so a replay that is refused (its owner at the
queued cap) leaves nothing behind for longer than the keep time. A record comes back as its end
left it (restore_record_v1: history, estimate, its owner's indexes), kept for what it had left
of LEASH_RESULT_TTL: a refused replay leaves the job as Redis held it before it lost it.

A replay's dry run writes nothing: it reads what a replay would put back
(``records_to_restore``, ``errored_to_restore``) and says what the replay would do with it."""

from __future__ import annotations

import json
import time

from redis import Redis
from sqlalchemy.exc import SQLAlchemyError

from jobs import keys
from jobs.archive import reading
from jobs.config import settings, stores
from jobs.core import outcome, payload_copy
from jobs.core.text import decoded
from jobs.errors import ArchiveUnreachable
from jobs.lifecycle import transitions


def records(connection: Redis, job_ids: list[str], now: float | None = None) -> dict[str, str]:
    """Put back the records of those ``job_ids`` Redis no longer holds and the archive does, so a
    replay finds them (then ``restore`` brings back their payload copy, results and usage). Returns
    {job id: "restored" or "present"} for those; a job neither holds is left out (the replay says it does not
    exist). ``ArchiveUnreachable`` while the archive does not answer: nothing is replayed then."""
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.exists(keys.job(job_id))
        held = pipe.execute()
    now = time.time() if now is None else now
    keep, result_ttl = max(1, stores.archive().redis_keep), settings().result_ttl
    restored: dict[str, str] = {}
    for job_id in (job_id for job_id, there in zip(job_ids, held, strict=True) if not there):
        found = reading.ended_job(job_id, connection)
        if found is None:
            continue
        ended = float(found.record.get("ended_at") or now)
        how = transitions.restore_record(connection, job_id, found.owner, [
            job_id, now, max(keep, int(ended + result_ttl - now)), json.dumps(found.record),
            json.dumps(found.errors), json.dumps(found.history), found.estimate or "", found.archived_at])
        restored[job_id] = decoded(how)  # "present": a replay or a restore got there first
    return restored


def records_to_restore(connection: Redis, job_ids: list[str]) -> dict[str, dict[str, str]]:
    """What ``records`` would put back, read and nothing written (a replay's dry run): {job id: its
    archived record, the job hash as its end left it} for those of ``job_ids`` Redis no longer holds
    and the archive does. ``ArchiveUnreachable`` while the archive does not answer."""
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.exists(keys.job(job_id))
        held = pipe.execute()
    found = {job_id: reading.ended_job(job_id, connection)
             for job_id, there in zip(job_ids, held, strict=True) if not there}
    return {job_id: ended.record for job_id, ended in found.items() if ended is not None}


def errored_to_restore(connection: Redis, job_id: str) -> list[int] | None:
    """The indexes of the job's items whose result is an item error as ``restore`` would put them
    back, read and nothing written (a dry run of ``--errored-items``): from the archive when Redis no
    longer holds the job's items (its payload copy left, or its record too) and the archive holds
    the job; None when Redis' are the ones a replay reads."""
    with connection.pipeline(transaction=False) as pipe:
        pipe.exists(keys.job(job_id))
        pipe.hexists(keys.job(job_id), "archived_at")
        pipe.exists(keys.payload(job_id))
        held, archived, items_held = pipe.execute()
    if items_held or (held and not archived):
        return None
    try:
        if reading.job(job_id, connection) is None:
            return None
        rows = reading.page(job_id, 0, 1 << 30, connection)
    except SQLAlchemyError:  # its words (addresses, the engine's) are the operator's: `leash archive status`
        raise ArchiveUnreachable(f"job {job_id}'s items are in the archive, which did not answer; "
                                 "try again once it is back") from None
    return [index for index, _, result, _ in rows if result is not None and outcome.is_item_error(json.loads(result))]


def restore(connection: Redis, job_ids: list[str]) -> dict[str, str]:
    """Put back what a replay needs of those ``job_ids`` that were archived and whose payload
    copy has left Redis. Returns {job id: "restored" or "unreachable"} for those; a job the
    archive does not hold is left as it is (the replay skips it, as any job without its payload)."""
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hexists(keys.job(job_id), "archived_at")
            pipe.exists(keys.payload(job_id))
        seen = pipe.execute()
    gone = [job_id for n, job_id in enumerate(job_ids) if seen[2 * n] and not seen[2 * n + 1]]
    keep = max(1, stores.archive().redis_keep)
    restored: dict[str, str] = {}
    for job_id in gone:
        try:
            row = reading.job(job_id, connection)
            rows = reading.page(job_id, 0, 1 << 30, connection) if row is not None else []
        except SQLAlchemyError:
            restored[job_id] = "unreachable"
            continue
        if row is None:
            continue
        payload = json.loads(row["payload"]) if row["payload"] else {}
        payload["items"] = [item for _, item, _, _ in rows]
        results = {str(index): result for index, _, result, _ in rows if result is not None}
        usage = {f"i{index}": raw for index, _, _, raw in rows if raw}
        usage.update(json.loads(row["usage"]) if row["usage"] else {})
        with connection.pipeline(transaction=False) as pipe:
            pipe.set(keys.payload(job_id), payload_copy.encode(payload), ex=keep, nx=True)
            if results:
                pipe.hset(keys.items(job_id), mapping=results)
                pipe.expire(keys.items(job_id), keep)
            if usage:
                pipe.hset(keys.usage(job_id), mapping=usage)
                pipe.expire(keys.usage(job_id), keep)
            pipe.execute()
        restored[job_id] = "restored"
    return restored
