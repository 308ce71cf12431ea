"""The few exceptions leash raises. The docstring is the default message."""


class LeashError(Exception):
    """A leash error."""

    def __init__(self, message: str | None = None):
        super().__init__(message or self.__doc__)


class InvalidJob(LeashError, ValueError):
    """The job cannot be enqueued as given."""


class NoSuchJob(LeashError, LookupError):
    """No such job."""


class PermanentError(LeashError):
    """The job cannot succeed however often it is retried."""


class ItemError(LeashError):
    """This item cannot be answered; it is stored as the item's error and the job goes on."""


class LeaseLost(LeashError):
    """This attempt no longer holds the job's lease; another attempt owns it now."""


#: The error text of a canceled job (it ends in ``failed``, the terminal state, flagged canceled).
CANCELED = "canceled"


class Canceled(LeashError):
    """canceled"""


class HandOff(LeashError):
    """The worker is shutting down; the job goes back to the queue without counting an attempt."""


class RetryLater(LeashError):
    """Try this job again later without counting an attempt (e.g. the model answered 429)."""

    def __init__(self, seconds: float, message: str | None = None):
        super().__init__(message or f"retry after {seconds:g}s")
        self.seconds = seconds


class NeedsDirect(LeashError):
    """A batch's answer for an item cannot be used as it is (a label outside the list): the
    item is asked again directly, where the kind's own correction runs."""

    def __init__(self, answer: str | None = None):
        super().__init__()
        #: The batch's answer, for a kind that repairs it (``BatchSpec.repair``) rather than ask anew.
        self.answer = answer


class Parked(LeashError):
    """The job's batch is at its provider and the job is parked (``Attempt.park``): the
    worker is given back until the next look, at ``look_at``."""

    def __init__(self, look_at: float):
        super().__init__(f"waiting at the provider until {look_at:.0f}")
        self.look_at = look_at


class PlainWorker(LeashError):
    """A leash job was taken by a plain RQ worker, which holds no lease; start `leash worker`."""


class QueueFull(LeashError):
    """Too many of this owner's jobs are waiting to run (LEASH_MAX_QUEUED_PER_OWNER)."""

    #: The HTTP status the doors answer it with.
    status = 429

    def __init__(self, message: str | None = None, retry_after: int = 60):
        super().__init__(message)
        self.retry_after = retry_after
