"""What the modules of one batch turn share: the job's batch record (``Record``) and the
turn's interface (``Turn``), which ``jobs.batch.run.BatchRun`` implements and the modules it
calls (cached.py, looks.py, room.py) use -- so they name no private method of it and import
nothing above them: the package has no import loop, not even one for the type checker.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from jobs import keys
from jobs.batch.parts import Part, as_ranges, from_ranges
from jobs.config import settings
from jobs.core.lease import Outcome
from jobs.errors import LeaseLost
from jobs.lifecycle import transitions

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from jobs.core.running.context import JobContext
    from jobs.models.provider import CallRequest
    from jobs.usage import budget
    from jobs.usage.meter import Pending


class Record:
    """The job's batch record (keys.provider_batches): fenced writes, read once per turn."""

    def __init__(self, ctx: JobContext):
        self.ctx = ctx
        self.key = keys.provider_batches(ctx.job_id)
        raw = {k.decode(): v.decode() for k, v in ctx.connection.hgetall(self.key).items()}
        self.first_at = float(raw["first_at"]) if raw.get("first_at") else None
        self.parts: dict[int, Part] = {}
        for name, value in raw.items():
            if name.startswith("intent:"):
                entry = json.loads(value)
                number = int(name.split(":")[1])
                self.parts[number] = Part(number, entry["attempt"], entry["at"], from_ranges(entry["items"]),
                                          raw.get(f"id:{number}"), raw.get(f"ended:{number}") == "1",
                                          entry.get("max"))
        self.direct = int(raw.get("direct") or 0)
        #: item index -> a batch answer to repair directly (``BatchSpec.repair``), kept across turns.
        self.again = {int(k[6:]): v for k, v in raw.items() if k.startswith("again:")}
        self.canceled_at = float(raw["canceled_at"]) if raw.get("canceled_at") else None  # past the longest wait
        self.failed_looks = int(raw.get("failed_looks") or 0)  # in a row
        #: What the job's read parts were billed: per script the most input tokens per prompt
        #: byte and how many answers that is from, and the longest answer (jobs/usage/batch_parts.py).
        seen = json.loads(raw.get("seen") or "{}")
        #: script -> (most input tokens per prompt byte, answers seen, fewest input tokens billed
        #: for one prompt, fewest bytes of one)
        self.rates: dict[str, tuple[float, int, int, int]] = {
            k: (float(v[0]), int(v[1]), int(v[2]), int(v[3])) for k, v in seen.get("rates", {}).items()}
        self.longest_answer: int | None = seen.get("longest")

    def seen_rate(self, script: str) -> tuple[float, int, int, int] | None:
        return self.rates.get(script)

    def learn(self, billed: list[tuple[str, int, int, int]]) -> None:
        """Remember what a read part's answers were billed (``(script, prompt bytes, input
        tokens, output tokens)`` each): by script the most tokens per byte and the fewest input
        tokens and the fewest bytes of one prompt, and the longest answer."""
        for script, size, input_tokens, output_tokens in billed:
            most, count, least, shortest = self.rates.get(script, (0.0, 0, input_tokens, size))
            self.rates[script] = (max(most, input_tokens / max(1, size)), count + 1, min(least, input_tokens),
                                  min(shortest, size))
            self.longest_answer = max(self.longest_answer or 0, output_tokens)
        if billed:
            self.note("seen", json.dumps({"rates": self.rates, "longest": self.longest_answer}, separators=(",", ":")))

    def note(self, *pairs: Any, job_hash: bool = False) -> None:
        """Fenced: written only while this attempt holds the lease (batch_note_v1)."""
        ttl = "" if job_hash else 2 * settings().result_ttl
        target = keys.job(self.ctx.job_id) if job_hash else self.key
        written = transitions.batch_note(self.ctx.connection, self.ctx.job_id, target,
                                         [self.ctx.attempt.token, ttl, *pairs])
        if int(written) != 1:
            self.ctx.attempt.settle(Outcome.SUPERSEDED)
            raise LeaseLost()

    def intend(self, part: Part) -> None:
        entry = {"attempt": part.attempt, "at": part.intent_at, "count": len(part.indexes),
                 "items": as_ranges(part.indexes)}
        if part.max_tokens is not None:
            entry["max"] = part.max_tokens  # the output a budget left each of its items
        pairs: list[Any] = [f"intent:{part.number}", json.dumps(entry, separators=(",", ":"))]
        if self.first_at is None:
            self.first_at = part.intent_at
            pairs += ["first_at", part.intent_at]
        self.note(*pairs)
        self.parts[part.number] = part


class Turn(Protocol):
    """One turn of a batch job (``jobs.batch.run.BatchRun``) as its helpers see it."""

    ctx: JobContext
    backend: Any
    items: list
    model: str
    max_tokens: int
    record: Record
    cut: str | None

    def request(self, index: int, max_tokens: int | None = None) -> CallRequest: ...

    def input_bound(self, index: int) -> int: ...

    def cost(self, what: str) -> Callable[[int, int], int]: ...

    def send(self, number: int, indexes: list[int], max_tokens: int | None = None) -> Part: ...

    def split(self, indexes: list[int], max_tokens: int | None = None) -> list[list[int]]: ...

    def admit(self, indexes: list[int], number: int, max_tokens: int | None = None) -> budget.Admission: ...

    def budget_reached(self, admission: budget.Admission) -> NoReturn: ...

    def stop_cut(self) -> NoReturn: ...

    def worst(self, indexes: Iterable[int], max_tokens: int | None = None) -> tuple[int, int | None]: ...

    def read(self, part: Part, done: dict) -> None: ...

    def give_back(self, parts: list[Part]) -> None: ...

    def drop_orphan(self, number: int) -> None: ...

    def store(self, chunk: list, usage: Pending) -> Pending: ...

    def value(self, index: int, request: CallRequest, outcome) -> Any: ...

    def finish(self) -> list[Any]: ...

    def park(self, counts: list[int] | None, stage: str = ...) -> None: ...

    def cancel_open(self, batch_ids: list[str] | None = None) -> None: ...
