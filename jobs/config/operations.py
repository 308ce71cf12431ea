"""The operator's settings (the web app's access log, a provider outage waited out), declared
in jobs/config/declarations.py with every other variable and read here as a typed group, as
jobs/config/stores.py does."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.config import _read


@dataclass(frozen=True)
class Operations:
    access_log: str
    provider_outage_max: float


def operations() -> Operations:
    return _read(Operations)
