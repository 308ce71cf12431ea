"""What leash raises, in two kinds that never mix. The docstring is each one's default message.

**Errors** (``LeashError``): the job, an item or a request cannot be done as asked -- an invalid
job, a job that cannot succeed, an item that cannot be answered, a model server that failed.

**Signals** (``Signal``): control flow, not failures. Each tells the code above it to stop, step
aside or come back later, and the runner turns it into a planned outcome; nothing is broken, so
an ``except LeashError`` never swallows one. Both derive from ``Exception``.

- ``HandOff``: the worker is shutting down (a deploy); the job goes back to the queue without
  counting an attempt.
- ``Parked``: a batch job's batch is at its provider; the worker is given back until the next look.
- ``RetryLater`` (and ``jobs.usage.budget.WaitingForRoom``, ``ProviderDown``): the job comes back
  later, no attempt counted (a 429, room in a budget that calls in flight hold, a provider that
  fails every call: an outage, waited out up to LEASH_PROVIDER_OUTAGE_MAX).
- ``Canceled``: the owner asked to stop; the job ends canceled, which leash neither counts nor
  reports as a failure.
- ``LeaseLost``: another attempt owns the job now; this one stops and writes nothing.
- ``NeedsDirect``: a batch's answer for an item cannot be used as it is; the item is asked again
  directly.
- ``jobs.core.running.items.NotStarted``: an item waiting to start gives up because its run is stopping.
- ``jobs.models.spending.WaitForRoom`` and ``AskForLess``: a call that does not fit a budget
  waits for room, or asks for fewer output tokens.

``jobs.core.running.items.StopReason`` is no exception: it holds whichever signal or error stops an item
run. Both kinds live in this one module, which kinds import: a module of signals beside it would
sit at the end of the longest import chain (tests/test_layers.py). tests/test_codebase.py checks
that every exception class in jobs/ is an error or a signal, never both.
"""


class LeashError(Exception):
    """A leash error."""

    def __init__(self, message: str | None = None):
        super().__init__(message or self.__doc__)


class InvalidJob(LeashError, ValueError):
    """The job cannot be enqueued as given."""


class NoSuchJob(LeashError, LookupError):
    """No such job."""


class ArchiveUnreachable(LeashError):
    """Redis no longer holds the job and the archive (SQL) did not answer: try again once it is back."""


class PermanentError(LeashError):
    """The job cannot succeed however often it is retried."""


class TooManyItemErrors(PermanentError):
    """Too many of the job's items ended in an error: every one, or more than max_item_errors."""


class ItemsTooLong(PermanentError):
    """A job of one answer over every item (reduce) took items from another job's results that are
    longer than LEASH_MAX_ITEM_CHARS: it cannot answer without them, nor take them at its price."""


class ItemError(LeashError):
    """This item cannot be answered; it is stored as the item's error and the job goes on."""


class PlainWorker(LeashError):
    """A leash job was taken by a plain RQ worker, which holds no lease; start `leash worker`."""


class QueueFull(LeashError):
    """Too many of this owner's jobs are waiting to run (LEASH_MAX_QUEUED_PER_OWNER)."""

    #: The HTTP status the doors answer it with.
    status = 429

    def __init__(self, message: str | None = None, retry_after: int = 60):
        super().__init__(message)
        self.retry_after = retry_after


class Signal(Exception):
    """A leash signal."""

    def __init__(self, message: str | None = None):
        super().__init__(message or self.__doc__)


class LeaseLost(Signal):
    """This attempt no longer holds the job's lease; another attempt owns it now."""


#: The error text of a canceled job (it ends in ``failed``, the terminal state, flagged canceled).
CANCELED = "canceled"


class Canceled(Signal):
    """canceled"""


class HandOff(Signal):
    """The worker is shutting down; the job goes back to the queue without counting an attempt."""


class RetryLater(Signal):
    """Try this job again later without counting an attempt (e.g. the model answered 429)."""

    def __init__(self, seconds: float, message: str | None = None):
        super().__init__(message or f"retry after {seconds:g}s")
        self.seconds = seconds


class ProviderDown(RetryLater):
    """The model provider failed every call (connection errors, 5xx, 529 overloaded): an outage,
    not this job's fault. The job waits for the provider with backoff, no attempt counted."""


class NeedsDirect(Signal):
    """A batch's answer for an item cannot be used as it is (a label outside the list): the
    item is asked again directly, where the kind's own correction runs."""

    def __init__(self, answer: str | None = None):
        super().__init__()
        #: The batch's answer, for a kind that repairs it (``BatchSpec.repair``) rather than ask anew.
        self.answer = answer


class Parked(Signal):
    """The job's batch is at its provider and the job is parked (``Attempt.park``): the
    worker is given back until the next look, at ``look_at``."""

    def __init__(self, look_at: float):
        super().__init__(f"waiting at the provider until {look_at:.0f}")
        self.look_at = look_at
