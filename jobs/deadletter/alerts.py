"""Alert on the failure rate, not on totals: failures in a recent window and the share of
ended jobs that failed, from the per-minute outcome counters (written by the Lua transitions
as jobs end, kept two days). Never scans jobs, so a scheduler can run it every minute.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from redis import Redis

from jobs import keys
from jobs.core import clock
from jobs.deadletter.durations import render
from jobs.deadletter.stats import window_counts
from jobs.errors import LeashError

#: The counters live this long, so no window can be longer.
MAX_WINDOW = keys.STATS_MINUTE_TTL
WEBHOOK_TIMEOUT = 5.0
WEBHOOK_RETRIES = 2


@dataclass
class Check:
    window: float
    kind: str | None
    failed: int
    succeeded: int
    max_failures: int | None
    max_ratio: float | None
    at: float
    breaches: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """Failed / (failed + succeeded); 0 when nothing ended."""
        ended = self.failed + self.succeeded
        return self.failed / ended if ended else 0.0

    @property
    def alerting(self) -> bool:
        return bool(self.breaches)

    @property
    def line(self) -> str:
        what = f"kind {self.kind}" if self.kind else "all kinds"
        head = "ALERT" if self.alerting else "OK"
        text = (f"{head} leash failures, {what}, last {render(self.window)}: {self.failed} failed, "
                f"{self.succeeded} succeeded, failure ratio {self.ratio:.3f}")
        return text + (f" ({'; '.join(self.breaches)})" if self.breaches else "")

    def as_dict(self) -> dict:
        return {"alert": self.alerting, "text": self.line, "window_seconds": self.window,
                "kind": self.kind, "failed": self.failed, "succeeded": self.succeeded,
                "ratio": round(self.ratio, 6), "max_failures": self.max_failures,
                "max_ratio": self.max_ratio, "breaches": self.breaches, "at": clock.iso(self.at)}


def check(connection: Redis, window: float = 3600, max_failures: int | None = None,
          max_ratio: float | None = None, kind: str | None = None, now: float | None = None,
          include_canceled: bool = False) -> Check:
    """The failure rate over ``window``; canceled jobs are not failures unless included."""
    if not 0 < window <= MAX_WINDOW:
        raise ValueError(f"the window must be longer than 0 and at most {render(MAX_WINDOW)} "
                         "(outcome counters are kept two days)")
    if max_failures is not None and max_failures < 0:
        raise ValueError("--max-failures must be 0 or more")
    if max_ratio is not None and not 0 <= max_ratio <= 1:
        raise ValueError("--max-ratio must be between 0 and 1")
    now = clock.wall() if now is None else now
    counts = window_counts(connection, int(window), kind=kind, now=now)
    failed = counts["failed"] + (counts["canceled"] if include_canceled else 0)
    result = Check(window, kind, failed, counts["succeeded"], max_failures, max_ratio, now)
    if max_failures is not None and result.failed > max_failures:
        result.breaches.append(f"{result.failed} failures > --max-failures {max_failures}")
    if max_ratio is not None and result.ratio > max_ratio:
        result.breaches.append(f"ratio {result.ratio:.3f} > --max-ratio {max_ratio:g}")
    return result


def post_webhook(url: str, payload: dict, timeout: float = WEBHOOK_TIMEOUT, retries: int = WEBHOOK_RETRIES,
                 sleep: Callable[[float], None] = time.sleep) -> None:
    """POST ``payload`` as JSON; retried on network errors and 5xx answers. Raises
    ``WebhookFailed`` once the retries are used up, or at once on a 4xx answer."""
    body = json.dumps(payload).encode()
    last = ""
    for attempt in range(retries + 1):
        if attempt:
            sleep(attempt)
        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Content-Type": "application/json", "User-Agent": "leash-alert"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                response.read()
                return
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
            if exc.code < 500:
                break
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))
    raise WebhookFailed(f"webhook {url} failed: {last}")


class WebhookFailed(LeashError):
    """The alert webhook did not take the alert."""
