"""leash's job lifecycle on RQ: enqueue, lease, worker, states, dead-letter.

Start reading at ``states`` (the state machine and the one function that decides state),
then ``lease`` (attempts and fencing), ``worker`` and ``runner`` (how an attempt runs and
ends), ``reaper`` (taking back expired leases). Key names: ``keys``; Lua: ``lua/``.
"""

from .control import cancel
from .effects import once
from .enqueue import enqueue
from .errors import InvalidJob, LeaseLost, NoSuchJob, PermanentError
from .kinds import kind
from .states import State, status

__all__ = ["InvalidJob", "LeaseLost", "NoSuchJob", "PermanentError", "State", "cancel", "enqueue",
           "kind", "once", "status"]
