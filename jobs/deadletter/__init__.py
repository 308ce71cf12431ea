"""The dead-letter path: failures are read (``failures``: grouped by kind and error), alerted on
by rate (``alerts``, from the per-minute counters in ``stats``) and replayed with one command
(``replayer``). ``synthetic`` writes failed jobs straight into Redis for tests and benchmarks.

The replay API is importable from here: ``from jobs import deadletter; deadletter.replay(...)``.
"""

from jobs.deadletter.replayer import (
    Candidate,
    ReplayOutcome,
    Selection,
    UnknownJobs,
    adopt_requeues,
    audit_log,
    default_actor,
    rebuild_rq_jobs,
    replay,
    select,
)

__all__ = ["Candidate", "ReplayOutcome", "Selection", "UnknownJobs", "adopt_requeues", "audit_log", "default_actor",
           "rebuild_rq_jobs", "replay", "select"]
