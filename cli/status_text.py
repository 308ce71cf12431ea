"""``leash status`` for people: one fact a line, in words, nothing that reads like Python
(no None, False or 34.9 s). Empty facts are left out; times are UTC with "5 min ago" / "in 58
s" beside them; the error's first line is cut at a word to fit the terminal, with the whole
text one flag away (``--full``). ``--json`` is the machine's answer and does not change."""

from __future__ import annotations

import json

from jobs.core import outcome
from jobs.read import humane, job_status, money

LABEL = 12


def _progress(f: dict) -> str | None:
    if not f["total"]:
        return None
    percent = 100 if f["state"] == "succeeded" else int(100 * f["done"] / f["total"])
    unit = humane.progress_unit(f.get("kind"))
    text = f"{f['done']} of {f['total']} {unit} ({percent}%)"
    if f.get("items_per_second"):
        text += f", {f['items_per_second']:.1f} {unit}/s"
    if f.get("eta_seconds") is not None:
        text += f", about {humane.duration(f['eta_seconds'])} left"
    return text


def _state(f: dict) -> str:
    state = outcome.words(f)
    phase = (f.get("batch") or {}).get("phase")
    waiting_at_provider = phase in ("waiting", "canceling")
    if f["stale"] and waiting_at_provider:
        state += " (stale: its look at the provider's batch is late; why: see waiting)"
    elif f["stale"]:
        state += " (stale: the worker stopped reporting; the job will be retried)"
    elif phase == "canceling":
        state += ", its canceled batch ending at the provider (no worker held)"
    elif waiting_at_provider:
        state += ", waiting at the provider (no worker held)"
    if f.get("budget_wait"):
        state += f", {f['budget_wait']['text']}"
    return state


def _mode(f: dict) -> str | None:
    batch = f.get("batch")
    if not batch:
        return None
    text = f"batch: {batch['batches']} provider batch(es), {batch['done']} of {batch['total']} requests done there"
    if batch["failed"]:
        text += f", {batch['failed']} failed"
    if batch["direct"]:
        text += f"; {batch['direct']} asked directly"
    if batch.get("failed_looks"):
        text += f"; the last {batch['failed_looks']} look(s) at the provider failed, it looks again"
    return text


def _attempt(a: dict) -> str:
    started = humane.utc(a.get("started_at"))
    return f"{started} on {a.get('worker') or '?'}: {a.get('ended') or '—'}"


def lines(f: dict, page: str, columns: int = 100, full: bool = False) -> list[str]:
    """The status of one job as lines of text, each fitting ``columns`` unless ``full``."""
    room = max(columns - LABEL - 3, 30)
    rows: list[tuple[str, str | None]] = [
        ("job", f["job_id"] + (f"  ({f['name']})" if f.get("name") else "")),
        ("state", _state(f)),
        ("kind", f["kind"]),
        ("pipeline", f"a stage of {f['pipeline']} (leash pipeline status {f['pipeline']})"
         if f.get("pipeline") else None),
        ("progress", _progress(f)),
        ("mode", _mode(f)),
        ("waiting", f.get("waiting")),
        ("attempts", humane.attempts(f)),
        ("next retry", humane.when(f["next_retry_at"]) if f.get("next_retry_at") else None),
        ("submitted", humane.when(f["created_at"])),
        ("started", humane.when(f["started_at"]) if f.get("started_at") else None),
        ("finished", humane.when(f["finished_at"]) if f.get("finished_at") else None),
        ("elapsed", humane.duration(f["elapsed_seconds"]) if f.get("elapsed_seconds") is not None else None),
        ("usage", money.spend_text(f)),
        ("labels", ", ".join(f["labels"]) if f.get("labels") else None),
        ("template", f.get("template")),
    ]
    error = f.get("error") if f.get("outcome") in (None, outcome.FAILED) else None
    if error:
        first = error.strip().splitlines()[0]
        if full:
            rows.append(("error", first))
            rows.extend(("", line) for line in error.strip().splitlines()[1:])
        else:
            more = " (whole text: --full)" if "\n" in error.strip() or len(first) > room else ""
            shown, _ = humane.cut(first, room - len(more), hard=True)
            rows.append(("error", shown + more))
    for a in f.get("history") or []:
        rows.append((f"attempt {a.get('attempt')}", _attempt(a)))
    if f.get("result"):
        rows.append(("summary", json.dumps(f["result"]["summary"], ensure_ascii=False)))
    if f["done"]:
        rows.append(("results", f"leash results {f['job_id']} (--format csv -o results.csv)"))
    rows.append(("page", page))
    if job_status.from_archive(f):
        rows.append(("source", job_status.ARCHIVE_NOTE))
    return [f"{label:<{LABEL}} {value}".rstrip() for label, value in rows if value not in (None, "")]
