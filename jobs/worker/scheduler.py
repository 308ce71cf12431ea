"""RQ's retry scheduler as ``leash worker`` runs it: started once, stopped for sure.

Every worker runs RQ's scheduler (it moves jobs whose retry backoff has passed back to
their queue) in a child process forked from the worker's main process; one scheduler per
queue holds the queue's lock. RQ stops it with one SIGTERM and waits for it without a
limit. That wait could last forever:

- A SIGTERM that reaches the new child before it has installed its own handler is lost:
  CPython drops signals that arrive while a fork completes, and a handler inherited from the
  worker runs inside the after-fork hooks, which swallow its exception. A worker that
  started a scheduler just before stopping it (RQ's maintenance restarts a dead scheduler,
  and a deploy's SIGTERM to the process group stops the old one) then waited on a scheduler
  that never heard the signal and kept renewing its lock.
- A scheduler whose worker was SIGKILLed lived on as an orphan, holding the lock.

So the child is forked with SIGTERM and SIGINT blocked and unblocks them only once its own
handlers are in place (a signal sent meanwhile waits in the kernel); a closed scheduler (the
worker is shutting down) never starts again; ``close`` repeats the SIGTERM, waits a bounded
time, then SIGKILLs and releases the locks itself. The child checks at every tick (its
interval, 1 s) that the worker that forked it is still its parent, and stops otherwise,
releasing its locks.

The child also closes its copies of the worker's Redis sockets as it starts. A fork shares
every open socket, and Redis sees a connection end only when its last holder closes it: a worker
SIGKILLed (OOM) while blocked in its dequeue (BLMOVE) would otherwise stay "blocked" at Redis
until its scheduler noticed the death, and Redis would hand the next job queued meanwhile to
that dead connection (the reaper puts such a job back, but only seconds later).
"""

from __future__ import annotations

import os
import signal
import time

import redis
from rq.scheduler import RQScheduler
from rq.scripts import release_lock

from jobs.core.store.connection import is_out_of_memory, is_sentinel_client, rebuilt
from jobs.core.store.memory_wait import MemoryWait

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class LeashScheduler(RQScheduler):
    #: How long ``close`` waits for the scheduler to stop by itself (it checks every
    #: ``interval`` seconds) before it is killed.
    stop_timeout = 3.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        connection = kwargs.get("connection", args[1] if len(args) > 1 else None)
        self._source = connection if is_sentinel_client(connection) else None
        self.closed = False
        self._worker_client = connection  # its sockets are closed in the scheduler process
        self.worker_pid = os.getpid()
        self.memory_wait: MemoryWait | None = None  # the scheduler process's own (jobs.core.store.memory_wait)

    # --- in the worker's main process ---------------------------------------------------

    def acquire_locks(self, auto_start: bool = False):
        if self.closed:
            return set()  # shutting down: taking a lock now would only leave it to expire
        if os.getpid() != self.worker_pid:  # RQ's loop in the scheduler process: ride out a full Redis
            taken: set = set()
            self._unless_full(lambda: taken.update(super(LeashScheduler, self).acquire_locks(auto_start)))
            return taken
        return super().acquire_locks(auto_start=auto_start)

    def start(self):
        if self.closed:
            return None
        self.worker_pid = os.getpid()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            return super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def close(self, wait: bool = True) -> None:
        """Stop the scheduler process for good. With ``wait``, return only once it has
        exited (killed after ``stop_timeout``) and its locks are free; without, just ask it
        to stop (the worker calls this from its signal handler, then again on the way out)."""
        self.closed = True
        process = self._process
        deadline = time.monotonic() + self.stop_timeout
        while process is not None and process.pid is not None and process.exitcode is None:
            _signal(process.pid, signal.SIGTERM)  # repeated: harmless, and a lost one cannot hang us
            if not wait:
                return
            if time.monotonic() > deadline:
                self.log.warning("scheduler process %s did not stop in %.0f s; killing it", process.pid,
                                 self.stop_timeout)
                _signal(process.pid, signal.SIGKILL)
                process.join()
                break
            process.join(min(0.5, self.interval))
        if wait:
            self.release_own_locks()

    def release_own_locks(self) -> None:
        """Free every lock this scheduler may hold (compare-and-delete on its name, so a
        lock another scheduler took over is left alone)."""
        try:
            for name in self._queue_names:
                release_lock(self.connection, self.get_locking_key(name), self.name)
        except redis.exceptions.RedisError as exc:
            self.log.warning("scheduler lock not released (it expires by itself): %s", exc)

    # --- in the scheduler process -----------------------------------------------------

    @property
    def connection(self):
        # RQ rebuilds the client in the scheduler process from the worker's pool settings; for
        # a Sentinel client that plain pool would keep connections to a demoted primary, so
        # the scheduler gets a Sentinel client of its own (jobs/core/store/connection.py).
        if self._connection is None and self._source is not None:
            self._connection = rebuilt(self._source)
        return super().connection

    def work(self):
        """RQ's loop; Redis gone (a failover, a restart) ends this process quietly, with one
        WARNING: its worker starts another within seconds of Redis answering again, so RQ's
        "raised an exception" ERROR and the process's traceback would alarm for nothing."""
        self._close_the_workers_sockets()
        try:
            super().work()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            self.log.warning("retry scheduler %s lost Redis (%s): it stops; its worker starts another within "
                             "seconds of Redis answering again (retries that fall due meanwhile wait until then)",
                             os.getpid(), exc)

    def _close_the_workers_sockets(self) -> None:
        """Close this process's copies of the worker's Redis sockets (see the module). In a
        process other than the one that opened it, redis-py's disconnect only closes the copy:
        the worker's own connection is untouched."""
        if self._worker_client is None or os.getpid() == self.worker_pid:
            return
        pool = self._worker_client.connection_pool
        for connection in [*getattr(pool, "_available_connections", ()), *getattr(pool, "_in_use_connections", ())]:
            connection.disconnect()
        self._worker_client = None

    def _install_signal_handlers(self):
        super()._install_signal_handlers()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # a SIGTERM sent meanwhile lands now

    def heartbeat(self):
        if self.orphaned():
            self.log.warning("worker process %s is gone; scheduler %s stopping", self.worker_pid, os.getpid())
            self.request_stop()  # RQ's loop stops and releases the locks at its next turn
            return
        self._unless_full(super().heartbeat, writes=True)

    def enqueue_scheduled_jobs(self):
        if self._stop_requested:
            return
        self._unless_full(super().enqueue_scheduled_jobs)

    def register_birth(self):
        self._unless_full(super().register_birth, writes=True)

    def _unless_full(self, step, writes: bool = False) -> None:
        """Run one step of RQ's scheduler loop; a write refused because Redis is full skips it
        (the loop tries again a tick later) instead of killing the scheduler process. Only a
        step that always writes (``writes``) tells that the wait is over."""
        if self.memory_wait is None:
            self.memory_wait = MemoryWait(self.log, f"retry scheduler {os.getpid()}")
        try:
            step()
        except redis.exceptions.ResponseError as exc:
            if not is_out_of_memory(exc):
                raise
            self.memory_wait.refused(exc)
            return
        if writes:
            self.memory_wait.accepted()

    def orphaned(self) -> bool:
        """True in a scheduler process whose worker died (it was re-parented)."""
        return os.getpid() != self.worker_pid and os.getppid() != self.worker_pid


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
