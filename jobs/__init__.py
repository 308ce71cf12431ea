"""leash's job lifecycle on RQ: enqueue, lease, worker, states, dead-letter.

Start reading at ``states`` (the state machine and the one function that decides state),
then ``lease`` (attempts and fencing), ``worker`` and ``runner`` (how an attempt runs and
ends), ``reaper`` (taking back expired leases). Key names: ``keys``; Lua: ``lua/``.
"""

from jobs.core.control import cancel
from jobs.core.effects import once
from jobs.core.states import State, status
from jobs.enqueue import enqueue
from jobs.errors import InvalidJob, LeaseLost, NoSuchJob, PermanentError
from jobs.kinds import kind

__all__ = ["InvalidJob", "LeaseLost", "NoSuchJob", "PermanentError", "State", "cancel", "enqueue",
           "kind", "once", "status"]
