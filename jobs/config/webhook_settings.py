"""Completion webhooks (jobs/webhooks/) read their settings (declared in jobs/config/declarations.py)
as one typed group."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.config import _read


@dataclass(frozen=True)
class Webhooks:
    webhook_url: str | None
    webhook_secret: str | None
    webhook_allow_private: bool
    #: seconds before each retry: a webhook is tried once more than the list is long
    webhook_backoff: list[int]

    @property
    def attempts(self) -> int:
        return len(self.webhook_backoff) + 1


def webhooks() -> Webhooks:
    return _read(Webhooks)
