"""Signed-in browser sessions, kept in Redis so that a copy of a cookie is worth nothing once its
session is gone.

    sign in ──start──▶ kept (id -> digest of the token) ──end / lapse / revoke──▶ gone
                         │
                         └─ the owner passes LEASH_MAX_SESSIONS: its oldest sessions are revoked

A session is live while Redis keeps it under its owner, unlapsed, with the digest of the token it
signed in with; the web app also checks that token is still one of LEASH_API_TOKENS (web/auth.py).
``forget_removed_tokens`` runs as the web app starts and drops every session whose token is no
longer configured, so a token removed and later added back does not bring its old sessions back
(the removal is seen by the first process started without it). A session found with a removed
token at sign-in time is dropped too.

The digest is a keyed digest of the token (the web app's secret is the key): Redis never holds a
token.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Set

from redis import Redis

from jobs import keys
from jobs.core import clock
from jobs.lifecycle import scripts


def start(connection: Redis, owner: str, digest: str, lifetime: int, most: int) -> tuple[str, int]:
    """A new session of ``owner`` for ``lifetime`` seconds: its id, and how many of the owner's
    oldest sessions were revoked to keep at most ``most``."""
    session_id = secrets.token_urlsafe(24)
    revoked = scripts.run(connection, "session_start_v1", keys={
        "sessions": keys.owner_sessions(owner), "expiries": keys.owner_session_expiries(owner),
        "owners": keys.SESSION_OWNERS}, args=[session_id, digest, clock.wall(), max(1, lifetime), max(1, most), owner])
    return session_id, int(revoked)


def live(connection: Redis, owner: str, session_id: str, digest: str) -> bool:
    """True when ``owner``'s session ``session_id`` is kept, unlapsed, for the token of ``digest``."""
    with connection.pipeline(transaction=False) as pipe:
        pipe.hget(keys.owner_sessions(owner), session_id)
        pipe.zscore(keys.owner_session_expiries(owner), session_id)
        kept, lapses = pipe.execute()
    return kept is not None and kept.decode() == digest and lapses is not None and lapses > clock.wall()


def end(connection: Redis, owner: str, session_id: str) -> None:
    """Sign one session out (every copy of its cookie with it)."""
    with connection.pipeline(transaction=True) as pipe:
        pipe.hdel(keys.owner_sessions(owner), session_id)
        pipe.zrem(keys.owner_session_expiries(owner), session_id)
        pipe.execute()


def count(connection: Redis, owner: str) -> int:
    """How many sessions ``owner`` has that have not lapsed."""
    return int(connection.zcount(keys.owner_session_expiries(owner), f"({clock.wall()}", "+inf"))


def forget_removed_tokens(connection: Redis, digests: Mapping[str, Set[str]]) -> int:
    """Drop every session whose token is not among ``digests`` (owner -> the digests of its
    configured tokens; an owner missing from it has none). Returns how many were dropped."""
    dropped = 0
    for raw_owner in connection.smembers(keys.SESSION_OWNERS):
        owner = raw_owner.decode()
        allowed = digests.get(owner, frozenset())
        stale = [session_id for session_id, digest in connection.hgetall(keys.owner_sessions(owner)).items()
                 if digest.decode() not in allowed]
        if stale:
            with connection.pipeline(transaction=True) as pipe:
                pipe.hdel(keys.owner_sessions(owner), *stale)
                pipe.zrem(keys.owner_session_expiries(owner), *stale)
                pipe.execute()
            dropped += len(stale)
    return dropped
