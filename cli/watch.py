"""``leash watch``: a job's progress on one terminal line until it ends.

The bar is click's progress bar (percent, done/total); beside it leash's own figures from
the status fields: items/s and ETA over the current attempt, elapsed time, stale, and the
first line of the last error while the job is retried. The line is cut to the terminal's
width minus one column, so it never wraps, and each redraw pads over the previous one. When
the output is not a terminal (a log, a pipe) it prints one plain line per change instead.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from typing import TextIO

import click

from jobs.core import outcome
from jobs.core.states import TERMINAL
from jobs.read import humane, money
from jobs.read.poll_schedule import poll_delay

BAR_TEMPLATE = "[%(bar)s] %(info)s"


def clock_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def facts(fields: dict) -> str:
    """What follows the bar: state, speed, ETA, elapsed, then what is wrong if anything."""
    parts = [outcome.words(fields)]
    at_provider = (fields.get("batch") or {}).get("phase") in ("waiting", "canceling")
    if fields.get("stale"):  # first: it is what a person must not miss
        parts.append("STALE: no look at its batch when due" if at_provider else "STALE: no heartbeat, will be retried")
    if fields.get("items_per_second"):
        parts.append(f"{fields['items_per_second']:.1f} items/s")
    if at_provider:
        parts.append(fields.get("waiting") or "waiting at the provider")
    elif fields["state"] == "running":
        parts.append(f"ETA {clock_text(fields.get('eta_seconds'))}")
    if fields.get("elapsed_seconds") is not None:
        parts.append(f"elapsed {clock_text(fields['elapsed_seconds'])}")
    if (fields.get("usage") or {}).get("calls") or (fields.get("usage") or {}).get("cache_hits"):
        parts.append(money.spend_text(fields))
    if fields["attempts"] > 1:
        parts.append(f"attempt {fields['attempts']}/{fields['max_attempts']}")
    if fields["state"] == "queued" and fields.get("waiting"):
        parts.append(fields["waiting"])
    if fields.get("error_summary") and fields.get("outcome") in (None, outcome.FAILED):
        parts.append(fields["error_summary"])
    return ", ".join(parts)


def fit(text: str, room: int) -> str:
    """``text`` in ``room`` columns, cut at a word where one is near (an error's URL is not
    split mid-way when the words before it fit); the whole error is ``leash status --full``."""
    if room <= 1:
        return text[:room] if len(text) <= room else "…"
    return humane.cut(text, room, hard=True)[0]


class JobLine:
    """One job's progress line, redrawn in place on a terminal."""

    def __init__(self, out: TextIO, columns: int | None = None, tty: bool | None = None):
        self.out = out
        self.columns = columns
        self.tty = out.isatty() if tty is None else tty
        self.bar = click.progressbar(length=1, file=out, show_pos=True, show_percent=True, show_eta=False,
                                     bar_template=BAR_TEMPLATE, fill_char="#", empty_char="-",
                                     item_show_func=lambda info: info)
        self.bar._is_atty = self.tty  # click decides from the file; tests pass a StringIO
        self.last_plain = None

    def draw(self, fields: dict) -> None:
        total, done = fields["total"] or 0, fields["done"] or 0
        if fields["state"] == "succeeded" and not total:
            total = done = 1
        info = facts(fields)
        if not self.tty:
            percent = int(100 * done / total) if total else 0
            line = f"{percent}% {done}/{total} {info}"
            if line != self.last_plain:
                self.last_plain = line
                self.out.write(line + "\n")
                self.out.flush()
            return
        columns = self.columns or shutil.get_terminal_size().columns
        bar = self.bar
        bar.length = max(total, 1)
        bar.pos = min(done, bar.length)
        bar.finished = False
        # Everything but the bar and the info: "[" "] " pos sep pct sep
        clutter = 3 + len(bar.format_pos()) + len(bar.format_pct()) + 2 * len(bar.info_sep)
        # The bar gives way to the facts (10 to 30 columns), then the facts are cut to fit.
        bar.width = max(10, min(30, columns - 1 - clutter - len(info)))
        bar.current_item = fit(info, columns - 1 - clutter - bar.width)
        if bar.max_width is not None:  # the terminal may have narrowed: never pad past its edge
            bar.max_width = min(bar.max_width, columns - 1)
        bar.render_progress()

    def close(self) -> None:
        if self.tty:
            # click's AFTER_BAR: shows the cursor its redraws hid, then ends the line.
            from click._termui_impl import AFTER_BAR

            self.out.write(AFTER_BAR)
            self.out.flush()


def follow(fetch: Callable[[], dict], first: dict, out: TextIO, sleep: Callable[[float], None] = time.sleep,
           clock: Callable[[], float] = time.monotonic, columns: int | None = None,
           tty: bool | None = None) -> dict:
    """Draw the job until it ends; returns its last status fields. Ctrl-C propagates."""
    line = JobLine(out, columns=columns, tty=tty)
    started = clock()
    fields = first
    try:
        while True:
            line.draw(fields)
            if fields["state"] in TERMINAL:
                return fields
            sleep(poll_delay(clock() - started))
            fields = fetch()
    finally:
        line.close()
