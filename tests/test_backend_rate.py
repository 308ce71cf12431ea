"""One rate limit for all workers: two worker processes sharing LEASH_MODEL_RPM=60 send the
fake model server one request a second between them, not one each."""

from __future__ import annotations

import pytest

from jobs import keys
from jobs.core import states
from jobs.enqueue import enqueue
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

RPM = 60
ITEMS_PER_JOB = 18  # 36 requests at one a second: about 35 s of measurement


def test_two_workers_sharing_rpm_60_send_60_requests_a_minute_between_them(conn, workers, model_server, env):
    env.setenv("LEASH_MODEL_RPM", str(RPM))
    env.setenv("LEASH_LEASE_SECONDS", "3")
    jobs = []
    for owner in ("alice", "bob"):
        items = [f"{owner}-{i}" for i in range(ITEMS_PER_JOB)]
        job_id, _ = enqueue(conn, "prompt", {"items": items, "template": "{item}"}, owner=owner)
        jobs.append(job_id)
    workers.start("--no-scheduler")
    workers.start("--no-scheduler")

    def all_succeeded():
        return all(states.status(conn, j)["state"] == "succeeded" for j in jobs)

    wait_for(all_succeeded, 2 * ITEMS_PER_JOB * 60 / RPM + 30, interval=0.5, message="both jobs to finish")

    times = sorted(r.at for r in model_server.requests)
    assert len(times) == 2 * ITEMS_PER_JOB
    measured_rpm = (len(times) - 1) / (times[-1] - times[0]) * 60
    print(f"two workers, LEASH_MODEL_RPM={RPM}: {len(times)} requests in {times[-1] - times[0]:.2f} s "
          f"= {measured_rpm:.1f} requests/minute")
    assert abs(measured_rpm - RPM) <= 0.10 * RPM

    # Both workers were calling the model at the same time, each on its own job.
    ran_on = {conn.hget(keys.job(j), "worker") for j in jobs}
    assert len(ran_on) == 2
    spans = [(min(r.at for r in model_server.requests if r.item.startswith(owner)),
              max(r.at for r in model_server.requests if r.item.startswith(owner))) for owner in ("alice", "bob")]
    overlap = min(s[1] for s in spans) - max(s[0] for s in spans)
    # Each job's items run several at once and each reserves its slot ahead, so one job can
    # hold the next few slots: the two spans overlap for most of the run, not all of it.
    assert overlap > 0.6 * (times[-1] - times[0])
