"""How a leash worker stops: a deploy's SIGTERM hands the running job back, the retry
scheduler always stops with the worker, and a stop never turns into an error.

A mixin of ``LeashWorker`` (jobs/worker/leash_worker.py), before RQ's ``Worker`` in its bases:

    SIGTERM / SIGINT while starting   ask to stop; no scheduler is started, no job taken
    first SIGTERM, idle               RQ's warm stop (the loop ends), recorded as well as raised,
                                      so code that swallows the raise (a log line) cannot lose it
    first SIGTERM, busy               the work-horse hands the job back at its next heartbeat
                                      (attempt not counted); after LEASH_HANDOFF_GRACE seconds the
                                      main process kills it and releases the job itself
    a second signal within 1 s        the same stop said twice (Ctrl+C, then the runner's SIGTERM)
    a second signal later             cold: the work-horse is killed, the job released at once
    the way out                       on fresh connections; the scheduler closed, its locks freed
"""

from __future__ import annotations

import functools
import os
import signal
from datetime import timedelta

from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT
from rq.exceptions import StopRequested
from rq.utils import now

from jobs.config import settings
from jobs.core import clock
from jobs.worker.log import log_not_a_failure
from jobs.worker.scheduler import LeashScheduler


class Shutdown:
    def bootstrap(self, *args, **kwargs):
        # RQ installs its signal handlers only after it has started the retry scheduler: a
        # SIGTERM in that window (a deploy right after a start) would end the worker at once
        # (status -15) and orphan its scheduler with the lock. Until then, a signal only asks
        # the worker to stop; its loop sees that before it takes any job.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._stop_while_starting)
        super().bootstrap(*args, **kwargs)

    def _stop_while_starting(self, signum, frame):
        self.log.info("Worker %s: stop requested while starting", self.name)
        self._stop_requested = True

    def _start_scheduler(self, burst=False, logging_level="INFO", date_format=DEFAULT_LOGGING_DATE_FORMAT,
                         log_format=DEFAULT_LOGGING_FORMAT):
        if self._stop_requested:
            return  # stopping already: a scheduler would only delay the exit
        # RQ's own, with a scheduler that a shutdown always stops (scheduler.py).
        self.scheduler = LeashScheduler(
            self.queues, connection=self.connection, serializer=self.serializer, date_format=date_format,
            log_format=log_format, logging_level=logging_level if logging_level is not None else self.log.level)
        if not self.scheduler.acquire_locks():
            return
        if not burst:
            self.scheduler.start()
            return
        try:  # a burst worker moves the due jobs once, in this process
            self.scheduler.register_birth()
            self.scheduler.enqueue_scheduled_jobs()
        finally:
            self.scheduler.release_locks()
            self.scheduler.register_death()

    def stop_scheduler(self):
        # RQ calls this from the SIGTERM handler while a job runs (ask it to stop; do not
        # block the handler) and from teardown, where close() has already waited.
        self.scheduler.close(wait=False)

    def teardown(self):
        if not self.is_horse:
            self._drop_idle_connections()
            if self.scheduler is not None:
                self.scheduler.close()  # bounded: repeats the SIGTERM, kills, releases its locks
        super().teardown()

    def _drop_idle_connections(self) -> None:
        # RQ's stop signal raises wherever the loop is, maybe between a command and its reply:
        # that pooled connection would give the reply to the next command ("Wrong number of ...").
        self.connection.connection_pool.disconnect(inuse_connections=False)

    def setup_work_horse_signals(self):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, functools.partial(_horse_sigterm, self._attempt))

    def handle_warm_shutdown_request(self):
        super().handle_warm_shutdown_request()
        if self.scheduler is not None:
            self.scheduler.closed = True  # from now on nothing may start it again
        if self.horse_pid and self._attempt is not None:
            self._handoff_deadline = clock.monotonic() + settings().handoff_grace
            try:
                os.kill(self.horse_pid, signal.SIGTERM)  # the horse hands off at its next heartbeat
            except ProcessLookupError:
                pass

    def request_stop(self, signum, frame):
        # RQ's warm stop raises StopRequested out of whatever the idle loop is doing. Code that
        # catches every Exception swallows it: logging's handlers do (they print "--- Logging
        # error ---" and go on), and the worker would keep running, deaf to the deploy. So the
        # stop is also recorded, and RQ's loop checks that before every dequeue; inside a log
        # line it is not raised at all (that check ends the loop instead).
        self._stop_requested = True
        try:
            super().request_stop(signum, frame)
        except StopRequested:
            if _inside_logging(frame):
                return
            raise

    @property
    def should_run_maintenance_tasks(self):
        # RQ asks this before every dequeue (its main loop's and the idle wait's, which
        # otherwise never looks at the stop): a stop whose StopRequested was swallowed ends
        # the loop here, before another job is taken.
        if self._stop_requested:
            raise StopRequested()
        return super().should_run_maintenance_tasks

    def _shutdown(self):
        super()._shutdown()  # idle: raises StopRequested; busy: the work-horse is handing off
        if self._handoff_deadline is not None:
            # The work-horse's monitor wakes every few seconds (an alarm); from now on every
            # second, so the grace period is kept to the second. Only a pending alarm is
            # shortened, once this handler has done its work.
            self.job_monitoring_interval = 1
            if signal.getitimer(signal.ITIMER_REAL)[0] > 1:
                signal.setitimer(signal.ITIMER_REAL, 1)

    def request_force_stop(self, signum, frame):
        # Within 1 s it is the same stop said twice (Ctrl+C reaches the terminal's group, then
        # honcho or `leash dev` sends SIGTERM): ignored, as in RQ, so a warm hand-off stays warm.
        if self._shutdown_requested_date and now() - self._shutdown_requested_date < timedelta(seconds=1):
            return
        # Cold: do not leave the job "started" as RQ would; release it now.
        attempt = self._attempt
        if attempt is not None and self.horse_pid:
            self.kill_horse()
            self.wait_for_horse()
            attempt.release()
            log_not_a_failure(attempt, None, how="at a cold shutdown")
        raise SystemExit()


def _inside_logging(frame) -> bool:
    while frame is not None:
        if frame.f_globals.get("__name__", "").split(".")[0] == "logging":
            return True
        frame = frame.f_back
    return False


def _horse_sigterm(attempt, signum, frame):
    if attempt is not None:
        attempt.handoff_requested = True


def still_running(child_pid: int) -> bool:
    """True if our child has not exited (and not been reaped, so its pid is still ours)."""
    try:
        return os.waitpid(child_pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False
