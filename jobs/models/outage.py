"""Telling a provider outage from one unlucky call.

A call that fails with a connection error or a 5xx (UNAVAILABLE) is sent again in place, after
1 s and 2 s (the lease renewed meanwhile). When OUTAGE_STREAK calls in a row fail so, across
the job's items, with no answer between them, the provider is down for everyone: the job waits
for it (``ProviderDown``: deferred with backoff, its checkpoint kept, its worker freed, no
attempt counted, up to LEASH_PROVIDER_OUTAGE_MAX; jobs/runner.py). A call whose sends keep
failing while other calls are answered fails as before (``ModelUnavailable``: the attempt
fails and the job is retried). Anthropic's 529 (overloaded) is waited on like a 429; five in
a row are an outage too.
"""

from __future__ import annotations

import threading

from jobs.errors import ProviderDown

#: Calls failed UNAVAILABLE in a row, across the job's items, with no answer between: an outage.
OUTAGE_STREAK = 3
#: Sends of one call failed so while other calls were answered: the call fails as before.
UNAVAILABLE_SENDS = 3


class OutageWatch:
    """One per backend (an attempt), shared by the threads running its items."""

    def __init__(self):
        self._failing = 0
        self._lock = threading.Lock()

    def answered(self) -> None:
        self._failing = 0

    def failed(self, message: str, sends: int, unavailable: type[Exception]) -> float:
        """A send failed UNAVAILABLE (``sends``: this call's failed sends so far). Raises
        ProviderDown for an outage, ``unavailable`` for this call's last send; else returns the
        seconds to wait before sending it again."""
        with self._lock:
            self._failing += 1
            failing = self._failing
        if failing >= OUTAGE_STREAK:
            raise ProviderDown(0, f"every call failed: {message}")
        if sends >= UNAVAILABLE_SENDS:
            raise unavailable(message)
        return float(sends)


def overloaded_out(overloaded: int, sends_429: int) -> None:
    """The 429 loop ended: if every refusal was a 529 (overloaded), the provider is down."""
    if overloaded and overloaded == sends_429:
        raise ProviderDown(0, f"the model provider answered 529 (overloaded) {overloaded} times in a row")
