"""One rate limit for every worker calling a model: ``LEASH_MODEL_RPM`` requests and
``LEASH_MODEL_TPM`` tokens per minute, kept in Redis by one Lua script
(``jobs/lua/model_rate_v1.lua``) so ten workers share one budget instead of each spending
the provider's whole limit and turning into a storm of 429s.

Requests are spread evenly (RPM=60 means one request a second across all workers, each
caller reserving the next free slot). Tokens are known only after a call, from the usage the
server returns: each call's tokens are paid off at the TPM rate, and a new call starts only
when earlier ones are paid. A 429 with Retry-After pauses every caller of that model.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis import Redis

from jobs import keys
from jobs.lifecycle import scripts

ACQUIRED, TOKENS_SPENT, PAUSED = 0, 1, 2


@dataclass
class Turn:
    """The limiter's answer: ``code`` (ACQUIRED / TOKENS_SPENT / PAUSED) and how long to wait."""

    code: int
    wait_seconds: float


#: The limiter's keys, by their names in model_rate_v1's KEYS line.
BUCKETS = ("requests", "tokens", "paused")


class ModelRateLimit:
    def __init__(self, connection: Redis, scope: str, rpm: float = 0, tpm: float = 0):
        self.connection = connection
        self.keys = [keys.model_rate(scope, bucket) for bucket in BUCKETS]  # model_admit takes them too
        self.ms_per_request = 60_000 / rpm if rpm else 0
        self.ms_per_token = 60_000 / tpm if tpm else 0

    def _run(self, op: str, amount: float = 0, max_wait: float = 0, now_ms: int | None = None) -> Turn:
        code, wait_ms = scripts.run(
            self.connection, "model_rate_v1", keys=dict(zip(BUCKETS, self.keys, strict=True)),
            args=[op, "" if now_ms is None else now_ms, self.ms_per_request, self.ms_per_token,
                  amount, int(max_wait * 1000)],
        )
        return Turn(int(code), int(wait_ms) / 1000)

    def acquire(self, max_pause: float, now_ms: int | None = None) -> Turn:
        """Ask for a request slot. ACQUIRED: the slot is yours, start after ``wait_seconds``.
        TOKENS_SPENT: ask again after ``wait_seconds``. PAUSED: the server asked everyone to
        wait longer than ``max_pause``; nothing was reserved."""
        return self._run("acquire", max_wait=max_pause, now_ms=now_ms)

    def spend(self, tokens: int, now_ms: int | None = None) -> None:
        """Record the tokens a finished call used (its usage, as the server reported it)."""
        if self.ms_per_token and tokens > 0:
            self._run("spend", amount=tokens, now_ms=now_ms)

    def pause(self, seconds: float, now_ms: int | None = None) -> None:
        """Make every caller wait ``seconds`` from now (the server answered 429)."""
        self._run("pause", amount=int(seconds * 1000), now_ms=now_ms)
