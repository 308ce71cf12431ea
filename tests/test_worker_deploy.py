"""Deploys, for real: honcho running the Procfile, SIGTERM to the worker's process group or
to its main process, busy or idle; the retry scheduler's lock; what the worker logs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from jobs import keys
from jobs.core import states
from jobs.enqueue import enqueue
from jobs.worker.scheduler import LeashScheduler
from tests.conftest import REDIS_URL, ROOT, wait_for

pytestmark = pytest.mark.slow

GRACE = 10
LOCK = keys.rq_scheduler_lock("leash")


@pytest.fixture
def deploy_env(env):
    # Leases long enough for multi-second items; the hand-off, not a reclaim, must free the job.
    env.setenv("LEASH_LEASE_SECONDS", "30")
    env.setenv("LEASH_HANDOFF_GRACE", str(GRACE))
    # One item at a time, so a job of multi-second items is still mid-item when the signal comes.
    env.setenv("LEASH_ITEM_CONCURRENCY", "1")
    return env


def start_logged(workers, log_path: Path, command: list[str], **extra_env: str) -> subprocess.Popen:
    """Start ``command`` in its own session with its output in ``log_path``; the ``workers``
    fixture kills it and everything it started by pid at the end."""
    environment = {**os.environ, **extra_env}
    environment["PYTHONPATH"] = str(ROOT) + os.pathsep + environment.get("PYTHONPATH", "")
    environment["PATH"] = str(Path(sys.executable).parent) + os.pathsep + environment.get("PATH", "")
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(command, env=environment, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    workers.procs.append(proc)
    workers.known_pids.add(proc.pid)
    return proc


def leash_worker(workers, log_path: Path, **extra_env: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "cli", "worker", "--log-level", "INFO"]
    return start_logged(workers, log_path, command, **extra_env)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def exit_code(proc: subprocess.Popen, timeout: float) -> int | str:
    """The process's exit status, or "still running" after ``timeout`` seconds."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return "still running"


def running(conn, job_id: str) -> bool:
    return states.status(conn, job_id)["state"] == "running"


def test_honcho_stopping_the_procfile_worker_hands_the_job_back_exits_and_logs_no_error(conn, workers, deploy_env,
                                                                                        tmp_path):
    failing, _ = enqueue(conn, "permanent", {}, max_attempts=1)
    slow, _ = enqueue(conn, "count", {"items": [f"item-{i}" for i in range(10)], "delay": 1.5})
    log_path = tmp_path / "honcho.log"
    honcho = start_logged(workers, log_path, [sys.executable, "-m", "honcho", "-f", "Procfile", "start", "worker"])
    wait_for(lambda: states.status(conn, failing)["state"] == "failed", 30, message="the failing job to fail")
    wait_for(lambda: running(conn, slow) and conn.get(LOCK), 20, message="the slow job running, scheduler locked")
    family = workers.children(honcho)  # honcho's runner, the shell's worker, its scheduler and work-horse
    time.sleep(1.0)  # mid-item

    os.kill(honcho.pid, signal.SIGTERM)  # a dyno stop: honcho sends SIGTERM to the worker's process group
    sent = time.monotonic()
    assert honcho.wait(timeout=GRACE + 5) is not None
    exited_after = time.monotonic() - sent
    wait_for(lambda: not any(alive(pid) for pid in family), 5, message="every process of the worker to be gone")

    fields = states.status(conn, slow)
    assert (fields["state"], fields["attempts"]) == ("queued", 0), "a deploy is not a failure"
    assert conn.lindex(keys.rq_queue("leash"), 0) == slow.encode()
    assert conn.get(LOCK) is None, "the scheduler lock is released on the way out"
    assert exited_after < GRACE + 5

    lines = log_path.read_text(errors="replace").splitlines()
    handed_back = [line for line in lines if "handed back" in line]
    assert len(handed_back) == 1 and slow in handed_back[0] and " INFO " in handed_back[0]
    assert f"{fields['done']}/10 items done" in handed_back[0]
    errors = [line for line in lines if " ERROR " in line]
    assert len(errors) == 1 and failing in errors[0], "only the real failure is an ERROR"
    tracebacks = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    assert tracebacks and all(failing in "\n".join(lines[i - 3:i]) for i in tracebacks), \
        "the only traceback is the real failure's"
    assert any("PermanentError: the model rejected the prompt" in line for line in lines)


# (signal the group or only the main process, when: "busy" = mid-item after the job ran
#  longer than the worker's scheduler check, "idle" = no job, "between" = short items,
#  "stuck" = a job that never reaches a checkpoint, with a 2 s grace)
TRIALS = [("group", "busy"), ("main", "busy"), ("group", "idle"), ("group", "between"), ("main", "idle"),
          ("group", "stuck"), ("group", "busy")]
STUCK_GRACE = 2


def sigterm_trial(conn, workers, log_path: Path, target: str, moment: str) -> dict:
    """Start a worker, bring it to ``moment``, SIGTERM ``target``; what happened."""
    conn.flushdb()
    grace = STUCK_GRACE if moment == "stuck" else GRACE
    worker = leash_worker(workers, log_path, LEASH_HANDOFF_GRACE=str(grace))
    job_id = None
    if moment == "idle":
        # Idle: listening, its scheduler started and its start-up maintenance done (a signal in
        # the first few ms of a worker's life has a test of its own, below).
        wait_for(lambda: conn.get(LOCK) and "cleaning group registries" in log_path.read_text(), 20,
                 message="the worker listening")
    elif moment == "stuck":
        job_id, _ = enqueue(conn, "hang", {"seconds": 60})
        wait_for(lambda: running(conn, job_id), 20, message="the job running")
    else:
        items, delay = (20, 0.1) if moment == "between" else (6, 1.5)
        job_id, _ = enqueue(conn, "count", {"items": [f"i{i}" for i in range(items)], "delay": delay})
        wait_for(lambda: running(conn, job_id), 20, message="the job running")
        # Busy: past the worker's periodic scheduler check (5 s), where a restart would happen.
        time.sleep(4.2 if moment == "busy" else 0.5)
    family = [worker.pid, *workers.children(worker)]
    sent = time.monotonic()
    if target == "group":
        os.killpg(worker.pid, signal.SIGTERM)
    else:
        worker.send_signal(signal.SIGTERM)
    code = exit_code(worker, grace + 5)
    log_text = log_path.read_text(errors="replace")
    job = states.status(conn, job_id) if job_id else None
    return {
        "trial": (target, moment), "exit code": code, "within grace + 5 s": time.monotonic() - sent < grace + 5,
        "left running": [pid for pid in family if alive(pid)], "lock": conn.get(LOCK),
        "schedulers started": log_text.count("Scheduler for leash started"),
        "job": job and (job["state"], job["attempts"]),
        "errors logged": log_text.count(" ERROR ") + log_text.count("Traceback"),
        "hand-off lines": log_text.count("handed back"),
    }


def test_sigterm_to_the_group_or_the_main_process_always_stops_the_worker_within_the_grace(conn, workers,
                                                                                          deploy_env, tmp_path):
    for number, (target, moment) in enumerate(TRIALS):
        outcome = sigterm_trial(conn, workers, tmp_path / f"worker-{number}.log", target, moment)
        job_expected = moment != "idle"
        expected = {**outcome, "exit code": 0, "within grace + 5 s": True, "left running": [], "lock": None,
                    "schedulers started": 1, "job": ("queued", 0) if job_expected else None, "errors logged": 0,
                    "hand-off lines": int(job_expected)}
        assert outcome == expected


def test_an_orphaned_scheduler_stops_within_seconds_and_releases_its_lock(conn, workers, deploy_env, tmp_path):
    worker = leash_worker(workers, tmp_path / "worker.log")
    wait_for(lambda: conn.get(LOCK), 20, message="the worker's scheduler to hold the lock")
    scheduler = wait_for(lambda: workers.children(worker), 10, message="the scheduler process")[0]
    os.kill(worker.pid, signal.SIGKILL)  # OOM or kill -9: only the main process dies
    killed = time.monotonic()
    wait_for(lambda: not alive(scheduler), 5, message="the orphaned scheduler to notice and stop")
    assert conn.get(LOCK) is None
    assert time.monotonic() - killed < 5


def test_a_scheduler_stopped_the_moment_it_starts_always_hears_the_stop(conn, deploy_env):
    """CPython drops a signal that reaches a forked child before the child installs its
    handler: RQ's scheduler then runs on and its worker waits for it forever."""
    for _ in range(15):
        scheduler = LeashScheduler(["leash"], connection=conn)
        scheduler.stop_timeout = 30  # a kill would hide a lost signal: it must stop on its own
        assert scheduler.acquire_locks() == {"leash"}
        process = scheduler.start()
        started = time.monotonic()
        scheduler.close()
        assert process.exitcode == 0, "stopped by its own SIGTERM handler, not killed"
        assert time.monotonic() - started < 5
        assert conn.get(LOCK) is None


def test_a_scheduler_that_does_not_stop_is_killed_and_its_lock_released(conn, deploy_env):
    scheduler = LeashScheduler(["leash"], connection=conn)
    scheduler.stop_timeout = 1
    scheduler.acquire_locks()
    process = scheduler.start()
    wait_for(lambda: conn.exists(scheduler.key), 10, message="the scheduler to run")
    os.kill(process.pid, signal.SIGSTOP)  # stuck: it cannot act on a SIGTERM
    started = time.monotonic()
    scheduler.close()
    assert process.exitcode == -signal.SIGKILL
    assert time.monotonic() - started < 3
    assert conn.get(LOCK) is None
    assert scheduler.acquire_locks(auto_start=True) == set() and scheduler._process is process, \
        "a closed scheduler never starts again"


def test_a_sigterm_while_the_worker_starts_still_ends_in_a_clean_exit(conn, workers, deploy_env, tmp_path):
    # RQ installs its signal handlers only after starting the retry scheduler; a deploy that
    # lands in between must not kill the worker outright and orphan the scheduler's lock.
    outcomes = []
    for number in range(6):
        conn.flushdb()
        log_path = tmp_path / f"starting-{number}.log"
        worker = leash_worker(workers, log_path)
        wait_for(lambda p=log_path: "Listening on" in p.read_text(errors="replace"), 20, interval=0.002,
                 message="the worker starting")
        family = [worker.pid, *workers.children(worker)]
        os.killpg(worker.pid, signal.SIGTERM)
        code = exit_code(worker, 10)
        wait_for(lambda f=family: not any(alive(pid) for pid in f), 5, message="every process of the worker gone")
        log_text = log_path.read_text(errors="replace")
        outcomes.append((code, conn.get(LOCK), "Traceback" in log_text))
    assert outcomes == [(0, None, False)] * 6


def test_a_stop_said_twice_at_once_stays_warm_and_a_second_stop_a_second_later_is_cold(conn, workers, deploy_env,
                                                                                       tmp_path):
    # Ctrl+C reaches the worker (SIGINT) and honcho or `leash dev` sends its own SIGTERM a moment
    # later: one warm stop, as in RQ, so the item in flight finishes and is kept. A second stop
    # said later is a cold one: the work-horse is killed, the job handed back at once.
    outcomes = {}
    for case in ("at once", "a second later"):
        conn.flushdb()
        log_path = tmp_path / f"{case.replace(' ', '-')}.log"
        worker = leash_worker(workers, log_path)
        job_id, _ = enqueue(conn, "count", {"items": [f"i{i}" for i in range(4)], "delay": 4})
        # The first item stored: the second is in flight for the next 4 s.
        wait_for(lambda j=job_id: states.status(conn, j)["done"] == 1, 20, message="the first item stored")
        worker.send_signal(signal.SIGINT)
        if case == "a second later":
            time.sleep(1.5)  # RQ's window for a repeated signal is 1 s
        worker.send_signal(signal.SIGTERM)
        code = exit_code(worker, GRACE + 5)
        log_text = log_path.read_text(errors="replace")
        job = states.status(conn, job_id)
        outcomes[case] = (code, job["state"], job["attempts"], job["done"], log_text.count("handed back"),
                          "at a cold shutdown" in log_text, log_text.count("Traceback"))
    assert outcomes == {"at once": (0, "queued", 0, 2, 1, False, 0),
                        "a second later": (0, "queued", 0, 1, 1, True, 0)}


def test_a_stop_that_cut_a_command_off_from_its_reply_still_ends_in_a_clean_exit(conn):
    # A stop signal raises out of whatever the worker loop was doing; between a command sent and
    # its reply read, the connection goes back to the pool with the reply still to come (here: a
    # BLPOP the server answers in 1 s). The way out must not read that reply as its own.
    from rq.worker import Worker

    from jobs.core.store.connection import connect
    from jobs.worker.leash_worker import LeashWorker

    worker = LeashWorker(["leash"], connection=connect(REDIS_URL))
    worker.register_birth()
    assert worker.key in Worker.all_keys(connection=conn)
    pool = worker.connection.connection_pool
    cut_off = pool.get_connection()
    cut_off.send_command("BLPOP", "test:nothing-here", 1)
    pool.release(cut_off)
    worker.teardown()  # records the worker's death, as at the end of RQ's loop
    assert worker.key not in Worker.all_keys(connection=conn)
