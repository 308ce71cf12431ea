"""Where ended jobs are archived (jobs/archive/), as a typed group of the settings declared in
jobs/config/declarations.py."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.config import _read


@dataclass(frozen=True)
class Archive:
    archive_url: str | None
    database_url: str | None
    redis_keep: int

    @property
    def url(self) -> str | None:
        """The archive's SQLAlchemy URL (None: no archive, results stay in Redis). A platform's
        ``postgres://`` or ``postgresql://`` means PostgreSQL through psycopg 3."""
        url = self.archive_url or self.database_url
        if not url:
            return None
        for scheme in ("postgres://", "postgresql://"):
            if url.startswith(scheme):
                return "postgresql+psycopg://" + url[len(scheme):]
        return url


def archive() -> Archive:
    return _read(Archive, {"database_url": "DATABASE_URL"})


@dataclass(frozen=True)
class ItemErrors:
    """How many item errors a job may end with and still succeed (jobs/core/outcome.py)."""

    max_item_errors: str | None


def item_errors() -> ItemErrors:
    return _read(ItemErrors)
