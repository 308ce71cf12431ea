"""What an owner may submit beyond one job's limits (jobs/intake/), as a typed group of the
settings declared in jobs/config/declarations.py."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.config import _read


@dataclass(frozen=True)
class Admission:
    max_queued_per_owner: int
    submit_rate: str | None
    dry_run_rate: str | None


def admission() -> Admission:
    return _read(Admission)
