"""A batch job's parts: which items each provider batch holds (as ranges, in the job's batch
record) and the custom ids that tie an answer to its item (jobs/batch/run.py)."""

from __future__ import annotations

from dataclasses import dataclass


def custom_id(job_id: str, index: int) -> str:
    """Names the job and the item in the provider's batch (its results come back by it), in
    the characters every provider accepts (jobs.models.batch_api.batching's form)."""
    return f"{job_id}-{index}"


def index_of(job_id: str, name: str) -> int | None:
    head, _, tail = name.rpartition("-")
    return int(tail) if head == job_id and tail.isdigit() else None


def as_ranges(indexes: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for i in indexes:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def from_ranges(ranges: list[list[int]]) -> list[int]:
    return [i for a, b in ranges for i in range(a, b + 1)]


@dataclass
class Part:
    """One provider batch of the job, as its record says."""

    number: int
    attempt: int
    intent_at: float
    indexes: list[int]
    batch_id: str | None = None
    ended: bool = False
    #: The output tokens its requests ask for when a budget left them fewer than max_tokens.
    max_tokens: int | None = None
