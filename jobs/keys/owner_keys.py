"""An owner's keys: the indexes of its jobs by state, its places at the door, its rate counters and
sessions, its usage by day and the budget reservations it holds."""

from __future__ import annotations

from jobs.keys.job_keys import PREFIX


def owner_jobs(owner: str) -> str:
    """Sorted set of an owner's job ids by creation time (for listings)."""
    return f"{PREFIX}owner:{owner}:jobs"

#: Every owner's job index (the state indexes' backfill gives each its expiry when it ends).
OWNER_JOBS_PATTERN = owner_jobs("*")


def owner_of_jobs_key(key: str) -> str:
    """The owner whose job index ``key`` is (the inverse of ``owner_jobs``)."""
    return key[len(owner_jobs("")) - len(":jobs"):-len(":jobs")]

#: The states an owner's jobs are indexed by, in the order ``owner_state_indexes`` gives
#: their keys (the Lua scripts rely on that order).
INDEXED_STATES = ("queued", "running", "succeeded", "failed")


def owner_state(owner: str, state: str) -> str:
    """Sorted set of an owner's job ids in one leash state, by creation time; the Lua transitions
    keep each job in exactly the index of its state (jobs/lua/_lib.lua, index_state)."""
    return f"{PREFIX}owner:{owner}:state:{state}"


def owner_expiries(owner: str) -> str:
    """Sorted set of an owner's ended job ids scored by when their records expire: the ended
    entries of the state indexes leave with their jobs (jobs/read/listing.py trims the due ones)."""
    return f"{PREFIX}owner:{owner}:expiries"


def owner_door_holds(owner: str) -> str:
    """Sorted set of the places an owner's submissions and replays took in the queued cap and have
    not yet written, by job id, scored by when each lapses (jobs/intake/door.py)."""
    return f"{PREFIX}owner:{owner}:door"


def owner_state_indexes(owner: str) -> list[str]:
    """The KEYS block a state-changing script takes: the state indexes, then the expiries."""
    return [owner_state(owner, state) for state in INDEXED_STATES] + [owner_expiries(owner)]

#: Prefix of the submission-rate counters (kept by the ``limits`` package, jobs/intake/admission.py).
SUBMIT_RATE_PREFIX = PREFIX + "submit_rate"
#: Prefix of the counters of failed sign-ins, tokens and dashboard passwords (jobs/intake/guesses.py).
GUESS_RATE_PREFIX = PREFIX + "guess_rate"


def guess_rate_scope(door: str, by: str, value: str) -> tuple[str, ...]:
    """The identifiers of one counter of failed guesses: at a door (signin, token, dashboard),
    by client address or by the failing guess (a keyed digest of it)."""
    return ("guess", door, by, value)


def owner_sessions(owner: str) -> str:
    """Hash of an owner's signed-in browser sessions: session id -> a keyed digest of the token it
    signed in with (jobs/intake/sessions.py). Expires with the newest session."""
    return f"{PREFIX}owner:{len(owner)}:{owner}:sessions"


def owner_session_expiries(owner: str) -> str:
    """Sorted set of an owner's session ids by when each lapses: the oldest go first when the
    owner passes LEASH_MAX_SESSIONS. Expires with the newest session."""
    return f"{PREFIX}owner:{len(owner)}:{owner}:session_expiries"

#: Set of the owners that have signed in from a browser: what the start-up sweep of sessions
#: whose token was removed walks (one entry per owner, never per session).
SESSION_OWNERS = f"{PREFIX}session_owners"


def rate_scope(counter: str, *values: str) -> tuple[str, ...]:
    """A counter under SUBMIT_RATE_PREFIX: ``("submit", owner)``, ``("dry-run", "owner"|"address", value)``."""
    return (counter, *values)


def usage_owner_day(owner: str, day: str) -> str:
    """Hash of an owner's usage during one UTC day (YYYY-MM-DD): totals, "by|<model>|<kind>|
    <field>", and the reservations of calls in flight (the daily budget's check)."""
    return f"{PREFIX}usage:owner:{len(owner)}:{owner}:{day}"


def owner_reservations(owner: str) -> str:
    """Sorted set of an owner's budget reservations (model calls and provider batches that may
    still be paid for), each by the time after which it can no longer be (its deadline):
    admission gives back the ones past it (model_admit_v3)."""
    return f"{PREFIX}reservations:{len(owner)}:{owner}"


def owner_reservation_records(owner: str) -> str:
    """Hash of an owner's reservations by id: what each holds (tokens, nano-USD), the job hash
    and the owner's day hash it is held in, and that UTC day (its usage is counted there)."""
    return f"{PREFIX}reservations:{len(owner)}:{owner}:records"


def reservation_owners() -> str:
    """Sorted set of the owners holding budget reservations, by their earliest deadline
    (reservations_sweep_v1 counts abandoned calls of owners who make no more)."""
    return f"{PREFIX}reservations:owners"
