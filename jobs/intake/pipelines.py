"""A pipeline: several stage jobs submitted in one request (``POST /pipelines``, ``leash submit
--pipeline FILE``), each an ordinary job of its kind, later stages naming earlier ones by their
stage name where a job id would go:

    {"name": "reviews", "budget": {"tokens": 200000}, "webhook_url": "https://...",
     "stages": [
       {"name": "classify", "kind": "classify", "items": [...], "labels": ["positive", "negative"]},
       {"name": "extract", "kind": "extract", "schema": {...},
        "items_from": {"stage": "classify", "label": "negative"}},
       {"name": "summary", "kind": "prompt", "template": "...", "after": ["extract"]}]}

    submit(connection, pipeline, dry_run=False)
      ├─ a repeat of the owner's idempotency key ─▶ the first pipeline (nothing written)
      ├─ every stage checked (``submission.checked``) ─▶ Invalid naming the stage: nothing written
      ├─ dry run: each stage priced (jobs/intake/pipeline_price.py) ─▶ the estimate, nothing written
      └─ the record, then each stage through ``submission.submit`` in order, its references to
         earlier stages resolved to their job ids; a stage refused there cancels those written

A stage's ``items_from: {"stage": S, ...}`` is ``items_from: {"job": <S's job id>, ...}``; a name
in its ``after`` that is a stage's is that stage's job. Stages run when what they wait for has
ended (jobs/core/parents.py), exactly as jobs chained by hand do.

With a budget for the whole pipeline every stage waits for the one before it (an implicit
``after``), so one stage runs at a time, and each stage starts with what the others left
(``stage_budget``, called by the runner as the stage starts): the stages' spending together
never passes the pipeline's budget (docs/STAGES.md).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import TYPE_CHECKING, NamedTuple

from redis import Redis

from jobs import keys
from jobs.config import settings
from jobs.core import clock, rq_side
from jobs.core.text import decoded
from jobs.enqueue import check_name
from jobs.errors import InvalidJob
from jobs.intake import pipeline_price
from jobs.read.pipeline_view import read_record
from jobs.usage import budget as budgets

if TYPE_CHECKING:
    from jobs.intake.submission import Submission

#: Stages one pipeline may have.
MAX_STAGES = 20
#: How long a submission holds its idempotency key while it writes its stages (then it is kept
#: as long as the record), and how long the same submission racing it waits for them.
CLAIM_SECONDS = 60
CLAIM_WAIT_SECONDS = 10
_STAGE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
#: A stage's fields that are options of its job, not part of its payload.
STAGE_OPTIONS = ("name", "kind", "max_attempts", "queue", "webhook_url", "after", "after_policy")
#: The pipeline's own fields (a pipeline file's, and ``POST /pipelines``'s body's).
PIPELINE_FIELDS = ("name", "stages", "budget", "webhook_url", "dry_run")


class Stage(NamedTuple):
    name: str
    kind: str
    payload: dict
    after: list[str]
    after_policy: str | None = None
    max_attempts: int | None = None
    queue: str | None = None
    webhook_url: str | None = None


class Pipeline(NamedTuple):
    """A pipeline as a door read it (``read``)."""

    stages: tuple[Stage, ...]
    owner: str
    name: str | None = None
    budget: budgets.Budget | None = None
    webhook_url: str | None = None
    idempotency_key: str | None = None
    address: str | None = None  # the client's, at a web door (its dry runs are counted)


class Submitted(NamedTuple):
    pipeline_id: str | None = None
    created: bool = False
    stages: tuple[tuple[str, str], ...] = ()  # (stage name, job id) in order
    estimate: dict | None = None


def _refused_stage(stage: str | int, message: str) -> InvalidJob:
    where = f"stage {stage!r}" if isinstance(stage, str) else f"stage {stage + 1}"
    return InvalidJob(f"{where}: {message}")


def read(body, owner: str, idempotency_key: str | None = None, address: str | None = None) -> Pipeline:
    """A pipeline from a request's body or a pipeline file's content, checked for its form
    (InvalidJob naming the stage); each stage's payload is checked by ``submit``."""
    if not isinstance(body, dict):
        raise InvalidJob("a pipeline is an object with \"stages\": [...]")
    unknown = sorted(set(body) - set(PIPELINE_FIELDS))
    if unknown:
        raise InvalidJob(f"a pipeline has no field {unknown[0]!r}: it takes {', '.join(PIPELINE_FIELDS)} "
                         "(a stage's fields go in its entry of \"stages\")")
    stages = body.get("stages")
    if not isinstance(stages, list) or not stages:
        raise InvalidJob("missing field 'stages': a pipeline's stages, a list of jobs each with a \"name\" and "
                         "a \"kind\"")
    if len(stages) > MAX_STAGES:
        raise InvalidJob(f"'stages' has {len(stages)} stages; at most {MAX_STAGES}")
    name = check_name(body.get("name"))
    budget = budgets.parse(body.get("budget"), "the pipeline's 'budget'")
    webhook_url = body.get("webhook_url")
    if webhook_url is not None and not isinstance(webhook_url, str):
        raise InvalidJob("'webhook_url' must be an http:// or https:// URL")
    every = {entry.get("name") for entry in stages if isinstance(entry, dict) and isinstance(entry.get("name"), str)}
    read_stages: list[Stage] = []
    for index, entry in enumerate(stages):
        read_stages.append(_stage(index, entry, [s.name for s in read_stages], every))
    return Pipeline(tuple(read_stages), owner, name, budget, webhook_url or None, idempotency_key, address)


def _stage(index: int, entry, earlier: list[str], every: set[str]) -> Stage:
    if not isinstance(entry, dict):
        raise _refused_stage(index, "a stage is an object with a \"name\", a \"kind\" and the job's fields")
    name = entry.get("name")
    if not isinstance(name, str) or not _STAGE_NAME.match(name):
        raise _refused_stage(index, "'name' must be 1-40 letters, digits, _ or - (later stages use it)")
    if name in earlier:
        raise _refused_stage(name, "two stages have this name")
    kind = entry.get("kind")
    if not isinstance(kind, str):
        raise _refused_stage(name, "missing field 'kind': the stage's job kind")
    after = entry.get("after")
    after = [after] if isinstance(after, str) else after
    if after is not None and not (isinstance(after, list) and all(isinstance(a, str) for a in after)):
        raise _refused_stage(name, "'after' must be a list of stage names (or job ids)")
    payload = {k: v for k, v in entry.items() if k not in STAGE_OPTIONS}
    chosen = payload.get("items_from")
    if isinstance(chosen, dict) and "stage" in chosen:
        if "job" in chosen:
            raise _refused_stage(name, "'items_from' names a \"stage\" or a \"job\", not both")
        if chosen["stage"] not in earlier:
            raise _refused_stage(name, f"'items_from' names stage {str(chosen['stage'])[:40]!r}, which is not "
                                       "one of the stages before it")
    for named in after or []:
        if named in every and named not in earlier:
            raise _refused_stage(name, f"'after' names stage {named!r}, which does not come before it")
    return Stage(name, kind, payload, list(after or []), entry.get("after_policy"), entry.get("max_attempts"),
                 entry.get("queue"), entry.get("webhook_url"))


def _resolved(stage: Stage, ids: dict[str, str]) -> tuple[dict, list[str]]:
    """The stage's payload and ``after`` with earlier stages' names replaced by their job ids."""
    payload = dict(stage.payload)
    chosen = payload.get("items_from")
    if isinstance(chosen, dict) and "stage" in chosen:
        payload["items_from"] = {"job": ids[chosen["stage"]], **{k: v for k, v in chosen.items() if k != "stage"}}
    return payload, [ids.get(named, named) for named in stage.after]


def _job_name(pipeline: Pipeline, stage: Stage) -> str:
    return f"{pipeline.name}: {stage.name}"[:100] if pipeline.name else stage.name


def _stage_submissions(door, pipeline: Pipeline, ids: dict[str, str], pipeline_id: str | None) -> list[Submission]:
    """Each stage as the one submission path takes it (``ids``: every stage's job id)."""
    return [_stage_submission(door, pipeline, index, ids, pipeline_id) for index in range(len(pipeline.stages))]


def _stage_submission(door, pipeline: Pipeline, index: int, ids: dict[str, str],
                      pipeline_id: str | None) -> Submission:
    """One stage as the one submission path takes it, the stages before it written (``ids``: their
    job ids). With a budget for the pipeline a stage waits for the one before it too (one stage
    at a time: see the module's docstring) and its own budget is at most the pipeline's."""
    stage = pipeline.stages[index]
    payload, after = _resolved(stage, ids)
    if pipeline.budget is not None:
        payload["budget"] = _within(budgets.parse(payload.get("budget"), f"stage {stage.name!r}: 'budget'"),
                                    pipeline.budget).as_dict()
        previous = ids[pipeline.stages[index - 1].name] if index else None
        if previous is not None and previous not in after:
            after.append(previous)
    key = _stage_key(pipeline.idempotency_key, stage.name)
    return door.Submission(stage.kind, payload, pipeline.owner, stage.max_attempts, stage.queue,
                           _job_name(pipeline, stage), key, webhook_url=stage.webhook_url, after=after,
                           after_policy=stage.after_policy, pipeline=pipeline_id)


def _stage_key(key: str | None, stage: str) -> str | None:
    """A stage's idempotency key: the pipeline's and the stage's name (a digest of the pipeline's
    when the two would pass the 200 characters a key may have)."""
    if not key:
        return None
    whole = f"{key}.{stage}"
    return whole if len(whole) <= 200 else f"{hashlib.sha256(key.encode()).hexdigest()[:64]}.{stage}"


def _within(own: budgets.Budget | None, whole: budgets.Budget) -> budgets.Budget:
    """The smaller of a stage's own budget and the pipeline's, limit by limit."""
    own = own or budgets.Budget()

    def least(a, b):
        return b if a is None else a if b is None else min(a, b)

    return budgets.Budget(least(own.tokens, whole.tokens), least(own.usd, whole.usd))


def _check_all(door, pipeline: Pipeline) -> None:
    """Every stage checked as its submission would be, nothing written (Invalid naming the first
    stage refused). Earlier stages' job ids are not known yet: stand-ins take their place."""
    stand_ins = {stage.name: f"stage-{stage.name}" for stage in pipeline.stages}
    for stage, made in zip(pipeline.stages, _stage_submissions(door, pipeline, stand_ins, None), strict=True):
        try:
            door.checked(made)
        except InvalidJob as exc:
            raise _refused_stage(stage.name, str(exc)) from None
    if pipeline.webhook_url is not None:
        from jobs.webhooks.requested import url_for_job

        try:
            url_for_job(pipeline.webhook_url)
        except InvalidJob as exc:
            raise InvalidJob(f"the pipeline's {exc}") from None


def submit(connection: Redis, pipeline: Pipeline, door, dry_run: bool = False) -> Submitted:
    """Answer a pipeline (see the module's docstring): Submitted, or raise InvalidJob (naming the
    stage) or ``door.Refused``. ``door`` is ``jobs.intake.submission``, handed down by the doors
    (the web app, the CLI): every stage goes through the one submission path."""
    if not dry_run and pipeline.idempotency_key:
        repeat = _repeat(connection, keys.pipeline_idempotency(pipeline.owner, pipeline.idempotency_key), door)
        if repeat is not None:
            return repeat
    if dry_run and pipeline.address is not None:
        from jobs.intake import admission

        refusal = admission.check_dry_run(connection, pipeline.owner, pipeline.address)
        if refusal is not None:
            raise door.Refused(refusal)
    _check_all(door, pipeline)
    if dry_run:
        stand_ins = {stage.name: f"stage-{stage.name}" for stage in pipeline.stages}
        return Submitted(estimate=pipeline_price.price(connection, pipeline, door,
                                                       _stage_submissions(door, pipeline, stand_ins, None)))
    return _write(connection, pipeline, door)


def _write(connection: Redis, pipeline: Pipeline, door) -> Submitted:
    pipeline_id = "p" + rq_side.new_job_id()
    ttl = settings().result_ttl
    stages = [{"name": s.name, "kind": s.kind, "job_id": None} for s in pipeline.stages]
    record = {"owner": pipeline.owner, "created_at": clock.wall(), "stages": json.dumps(stages)} \
        | ({"name": pipeline.name} if pipeline.name else {}) \
        | ({"webhook_url": _webhook(pipeline.webhook_url)} if pipeline.webhook_url else {}) \
        | (pipeline.budget.hash_fields() if pipeline.budget else {})
    with connection.pipeline() as pipe:
        pipe.hset(keys.pipeline(pipeline_id), mapping=record)
        pipe.expire(keys.pipeline(pipeline_id), ttl)
        pipe.zadd(keys.owner_pipelines(pipeline.owner), {pipeline_id: record["created_at"]})
        pipe.expire(keys.owner_pipelines(pipeline.owner), ttl)
        pipe.execute()
    key = keys.pipeline_idempotency(pipeline.owner, pipeline.idempotency_key) if pipeline.idempotency_key else None
    # The key is claimed before any stage is written, so the same submission racing this one (a
    # client's retry) answers this pipeline rather than writing stages that name a pipeline whose
    # record it then drops (their page's link and the pipeline's budget lost). Claimed for a
    # while first: a process that dies mid-write leaves the key to lapse, not to refuse for days.
    if key and not connection.set(key, pipeline_id, ex=CLAIM_SECONDS, nx=True):
        connection.zrem(keys.owner_pipelines(pipeline.owner), pipeline_id)
        connection.delete(keys.pipeline(pipeline_id))
        repeat = _repeat(connection, key, door)
        if repeat is None:
            raise door.Refused(_being_written())
        return repeat
    ids: dict[str, str] = {}
    created: list[str] = []  # the stages' idempotency keys this submission wrote
    for index, stage in enumerate(pipeline.stages):
        made = _stage_submission(door, pipeline, index, ids, pipeline_id)
        try:
            answer = door.submit(connection, made)
        except (InvalidJob, door.Refused) as exc:
            _undo(connection, pipeline_id, pipeline.owner, created, key)
            if isinstance(exc, door.Refused):
                raise
            raise _refused_stage(stage.name, str(exc)) from None
        if answer.created and made.idempotency_key:
            created.append(made.idempotency_key)
        ids[stage.name] = answer.job_id
        stages[index]["job_id"] = answer.job_id
        connection.hset(keys.pipeline(pipeline_id), "stages", json.dumps(stages))
        if key:
            connection.expire(key, CLAIM_SECONDS)  # still writing: held on
    if key:
        connection.set(key, pipeline_id, ex=ttl)  # written: the key lasts as long as the record
    return Submitted(pipeline_id, True, _pairs(stages))


def _undo(connection: Redis, pipeline_id: str, owner: str, created: list[str], key: str | None) -> None:
    """A stage refused after others were written ("atomic enough"): those are canceled, the record
    removed, and their idempotency keys and the pipeline's too, so the same submission again
    makes new jobs rather than returning the canceled ones."""
    cancel(connection, pipeline_id, _cancel_quietly)
    connection.zrem(keys.owner_pipelines(owner), pipeline_id)
    connection.delete(keys.pipeline(pipeline_id),
                      *[name for stage_key in created for name in (keys.idempotency(owner, stage_key),
                                                                    keys.legacy_idempotency(owner, stage_key))],
                      *([key] if key else []))


def _repeat(connection: Redis, key: str, door) -> Submitted | None:
    """The pipeline the owner's idempotency key names, once every stage of it is written (the
    submission that claimed the key may still be writing them); None when there is none."""
    deadline = time.monotonic() + CLAIM_WAIT_SECONDS
    while True:
        pipeline_id = decoded(connection.get(key))
        record = read_record(connection, pipeline_id) if pipeline_id else None
        if record is None:
            return None
        if all(stage["job_id"] for stage in record["stages"]):
            return Submitted(record["pipeline_id"], False, _pairs(record["stages"]))
        if time.monotonic() > deadline:
            raise door.Refused(_being_written())
        time.sleep(0.05)


def _being_written():
    from jobs.intake.admission import Refusal

    return Refusal(409, "this pipeline (its Idempotency-Key) is being submitted by another request; try again in "
                        "a moment", 1)


def _pairs(stages: list[dict]) -> tuple[tuple[str, str], ...]:
    return tuple((stage["name"], stage["job_id"]) for stage in stages)


def _webhook(url: str) -> str:
    from jobs.webhooks.requested import url_for_job

    return url_for_job(url)


def _cancel_quietly(connection: Redis, job_id: str) -> str:
    from jobs.core import control

    return control.cancel(connection, job_id)


def cancel(connection: Redis, pipeline_id: str, cancel_job) -> list[tuple[str, str, str]]:
    """Cancel every stage through ``cancel_job(connection, job_id)`` (the door's own job cancel),
    last stage first, so no stage is let go by an earlier one's end meanwhile. Returns (stage,
    job id, the state it was in) for each stage written."""
    record = read_record(connection, pipeline_id)
    if record is None:
        return []
    done = []
    for stage in reversed(record["stages"]):
        if stage["job_id"]:
            done.append((stage["name"], stage["job_id"], str(cancel_job(connection, stage["job_id"]))))
    return list(reversed(done))
