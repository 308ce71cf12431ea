"""Status fields in words for people: the one convention the pages and the CLI share.

Times are UTC, ``2026-12-01 03:44:40 UTC``, with the distance from now beside them ("5 min
ago", "in 58 s"); a count of attempts says when no retry will come; long texts are cut at a
word boundary, never inside a word or a URL, and say where the whole text is.
"""

from __future__ import annotations

from datetime import datetime

from jobs.core import clock
from jobs.core.rq_side import ENDED_BY_RQ, PLAIN_WORKER, REMOVED

_OUTSIDE = (REMOVED, PLAIN_WORKER, *ENDED_BY_RQ.values())


def duration(seconds: float | None) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``; ``—`` for unknown."""
    if seconds is None:
        return "—"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def _rough(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 60:
        return f"{int(seconds)} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    if seconds < 2 * 86400:
        return f"{int(seconds // 3600)} h"
    return f"{int(seconds // 86400)} days"


def relative(iso: str | None, now: float | None = None) -> str:
    """"5 min ago", "in 58 s", "just now"; "" for no time."""
    if not iso:
        return ""
    now = clock.wall() if now is None else now
    delta = datetime.fromisoformat(iso).timestamp() - now
    if abs(delta) < 1:
        return "just now"
    return f"in {_rough(delta)}" if delta > 0 else f"{_rough(delta)} ago"


def utc(iso: str | None) -> str:
    """``2026-12-01 03:44:40 UTC``; ``—`` for no time."""
    return f"{iso[:19].replace('T', ' ')} UTC" if iso else "—"


def when(iso: str | None, now: float | None = None) -> str:
    """``2026-12-01 03:44:40 UTC (5 min ago)``."""
    return f"{utc(iso)} ({relative(iso, now)})" if iso else "—"


def no_retry_reason(fields: dict) -> str | None:
    """Why a failed job got no more attempts though it had some left, or None."""
    if fields["state"] != "failed" or fields.get("canceled") or fields["attempts"] >= fields["max_attempts"]:
        return None
    error = fields.get("error") or ""
    if error.startswith(_OUTSIDE):
        return "no retry: ended outside leash"
    return "no retry: permanent error" if fields["attempts"] else None


def attempts(fields: dict) -> str:
    """``2 of 3``, or ``1 (no retry: permanent error)`` when the count would promise retries
    that will never come."""
    reason = no_retry_reason(fields)
    if reason:
        return f"{fields['attempts']} ({reason})"
    return f"{fields['attempts']} of {fields['max_attempts']}"


def cut(text: str, width: int, hard: bool = False) -> tuple[str, bool]:
    """``text`` in at most ``width`` characters, cut at a word boundary with "…"; and whether
    anything was left out. A first word longer than the width (a URL) is kept whole where the
    reader can wrap it, or cut inside with ``hard`` (one terminal line that must not wrap)."""
    if len(text) <= width:
        return text, False
    head = text[:max(width - 1, 1)]
    space = head.rfind(" ")
    if space > width // 3:
        return head[:space].rstrip(" ,;:") + "…", True
    if hard:
        return head + "…", True
    word_end = text.find(" ", width)
    return (text if word_end < 0 else text[:word_end] + " …"), word_end >= 0


def progress_unit(kind: str | None) -> str:
    """What a job's ``done`` and ``total`` count: its items, or a ``reduce`` job's model calls
    (jobs/core/running/chunk_tree.py)."""
    return "model calls" if kind == "reduce" else "items"
