"""What ``leash dev`` prints while it runs: one line per job event (submitted, started, retried,
waiting at its provider, succeeded, failed, canceled), never one per model call. The workers and
the web app log only warnings and errors unless ``leash dev -v`` asks for their every line.

The feed reads the jobs' own records once a second: each owner's newest jobs (a development
Redis has few owners), and prints what changed since the last read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis import Redis

from jobs import keys
from jobs.core import clock, outcome, states
from jobs.core.text import decoded
from jobs.read import humane, money

#: Newest jobs per owner the feed follows.
FOLLOWED = 50
#: Owners' indexes the feed reads at most (a development Redis).
MAX_OWNERS = 20


def backend_line() -> str:
    """Which model backend the workers use and where it is, for the banner."""
    from jobs.config import model_calls
    from jobs.models.backends import backend_name

    name = backend_name()
    if name == "local":
        return ("model: local, the offline stand-in (labels from keyword hints, answers echo the prompt); "
                "set LEASH_MODEL_URL and LEASH_MODEL_NAME for a real model")
    calls = model_calls()
    url = (calls.model_url or "").strip() or "the provider's default address"
    return f"model: {calls.model_name or '(LEASH_MODEL_NAME unset)'} via {name} at {url}"


def _label(fields: dict[str, Any]) -> str:
    return f"job {fields['job_id'][:10]}" + (f" ({fields['name']})" if fields.get("name") else "")


def _event(before: tuple | None, fields: dict[str, Any]) -> str | None:
    """The line for what changed, or None."""
    view = fields.get("outcome") or fields["state"]
    phase = (fields.get("batch") or {}).get("phase")
    now = (view, fields["attempts"], phase == "waiting")
    if before == now:
        return None
    who = _label(fields)
    if view == "queued":
        if before is None:
            return f"{who} queued: {fields['total']} {fields['kind']} item{'s' if fields['total'] != 1 else ''}"
        return f"{who} queued again: {fields.get('waiting') or 'waiting for a worker'}"
    if view == "running":
        if phase == "waiting":
            return f"{who} waiting at the provider (no worker held)"
        if before is not None and before[0] == "running" and before[1] == fields["attempts"]:
            return f"{who} back from the provider"
        return f"{who} running, attempt {fields['attempts']} of {fields['max_attempts']}"
    took = humane.duration(fields.get("elapsed_seconds"))
    unit = humane.progress_unit(fields.get("kind"))
    usage = fields.get("usage") or {}
    spent = money.spend_text(fields) if usage.get("calls") or usage.get("cache_hits") else "no model answer billed"
    if view == outcome.SUCCEEDED:
        return f"{who} succeeded: {fields['done']} of {fields['total']} {unit} in {took}; {spent}"
    if view == outcome.WITH_ITEM_ERRORS:
        return f"{who} {outcome.words(fields)} in {took}; {spent}"
    if view in (outcome.CANCELED_OUTCOME, outcome.STOPPED):
        return f"{who} {outcome.words(fields)} after {fields['done']} of {fields['total']} {unit}"
    return f"{who} failed after {fields['done']} of {fields['total']} {unit}: {fields.get('error_summary')}"


class Feed:
    """Job events since the last ``poll``; the first poll only learns what is there."""

    def __init__(self, connection: Redis, say: Callable[[str], None]):
        self.connection = connection
        self.say = say
        self.seen: dict[str, tuple] = {}
        self.started = False

    def _ids(self) -> list[str]:
        ids: list[str] = []
        owners = list(self.connection.scan_iter(keys.OWNER_JOBS_PATTERN, count=100))[:MAX_OWNERS]
        for key in owners:
            ids += [decoded(i) for i in self.connection.zrevrange(key, 0, FOLLOWED - 1)]
        return ids

    def poll(self) -> int:
        """Print each change; how many lines were printed."""
        printed = 0
        now = clock.wall()
        for job_id in self._ids():
            raw, rq_status, errors, history = states.read_with_history(self.connection, job_id)
            if not raw:
                continue
            fields = states.from_raw(job_id, raw, rq_status, now=now, errors=errors, history=history)
            view = fields.get("outcome") or fields["state"]
            key = (view, fields["attempts"], (fields.get("batch") or {}).get("phase") == "waiting")
            before = self.seen.get(job_id)
            self.seen[job_id] = key
            if not self.started and view in outcome.ENDED:
                continue  # ended before this run: nothing new to say
            line = _event(before, fields)
            if line is not None:
                self.say(f"{clock.iso(now)[11:19]}  {line}")
                printed += 1
        self.started = True
        return printed
