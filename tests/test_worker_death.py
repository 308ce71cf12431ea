"""Worker death, for real: SIGKILL, orphaned work-horses, SIGSTOP zombies, SIGTERM deploys."""

from __future__ import annotations

import os
import signal
import time

import pytest

from jobs import keys, states
from jobs.enqueue import enqueue
from tests.conftest import wait_for
from tests.kinds_for_tests import item_calls

pytestmark = pytest.mark.slow

ITEMS = [f"item-{i}" for i in range(20)]


def state(conn, job_id):
    return states.status(conn, job_id)


def test_sigkill_of_whole_worker_mid_job_is_resumed_elsewhere_within_lease_plus_3s(conn, workers):
    job_id, _ = enqueue(conn, "count", {"items": ITEMS, "delay": 0.2})
    first = workers.start("--no-scheduler")
    wait_for(lambda: state(conn, job_id)["done"] >= 5, 20, message="progress on the first worker")
    horse = workers.horse(first)
    second = workers.start("--no-scheduler")
    done_before_kill = set(int(k) for k in conn.hkeys(keys.items(job_id)))
    os.kill(first.pid, signal.SIGKILL)
    os.kill(horse, signal.SIGKILL)
    killed_at = time.monotonic()

    wait_for(lambda: state(conn, job_id)["attempts"] == 2 and state(conn, job_id)["state"] == "running",
             2 + 3, message="the job running again on the second worker")
    resumed_after = time.monotonic() - killed_at
    final = wait_for(lambda: (s := state(conn, job_id))["state"] == "succeeded" and s, 30)

    assert resumed_after <= 5.0
    assert final["done"] == final["total"] == 20
    calls = item_calls(conn, job_id)
    assert all(calls[i] == 1 for i in done_before_kill), "checkpointed items were computed again"
    assert sorted(calls) == list(range(20))
    assert second.poll() is None


def test_orphaned_work_horse_is_reclaimed_and_its_late_result_rejected(conn, workers):
    job_id, _ = enqueue(conn, "count", {"items": ITEMS, "delay": 0.3, "record_pid": True})
    first = workers.start("--no-scheduler")
    wait_for(lambda: state(conn, job_id)["done"] >= 2, 20)
    orphan = workers.horse(first)
    os.kill(first.pid, signal.SIGKILL)  # only the main process: the horse keeps running
    workers.start("--no-scheduler")

    wait_for(lambda: state(conn, job_id)["attempts"] == 2, 10, message="reclaim of the orphan's job")
    final = wait_for(lambda: (s := state(conn, job_id))["state"] == "succeeded" and s, 40)
    assert final["attempts"] == 2
    # The orphan stops at its first write after the reclaim; it must not have finished the job.
    wait_for(lambda: not _alive(orphan), 20, message="the orphan to exit")
    finishers = [int(p) for p in conn.lrange(f"test:finished_by:{job_id}", 0, -1)]
    assert orphan not in finishers
    assert len(finishers) == 1
    assert int(conn.get(keys.REJECTED_WRITES) or 0) >= 1
    assert state(conn, job_id)["state"] == "succeeded"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
