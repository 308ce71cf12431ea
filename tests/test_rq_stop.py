"""RQ's stop command (rq-dashboard's Stop, ``send_stop_job_command``) on a running leash job
reads "stopped by RQ's stop command" wherever a canceled job reads canceled: the status JSON's
``outcome``, the job page, `leash status`, `leash jobs --state stopped`, `leash watch` and
/metrics; a leash cancel that falls back to the same command still reads canceled."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from rq.command import send_stop_job_command
from rq.job import Job
from rq.serializers import JSONSerializer

from cli import main
from jobs.core import states
from jobs.core.outcome import STOPPED_BY_RQ
from jobs.enqueue import enqueue
from tests.conftest import wait_for
from tests.test_web_metrics import samples
from tests.web_support import HTML, create_app_with

pytestmark = pytest.mark.slow

OWNER = "shared"


def test_rqs_stop_command_reads_as_stopped_everywhere(conn, workers, env):
    env.setenv("LEASH_IMPORTS", "tests.kinds_for_tests")
    workers.start("--no-scheduler")
    job_id, _ = enqueue(conn, "hang", {"seconds": 60}, owner=OWNER)
    wait_for(lambda: states.status(conn, job_id)["state"] == "running", 60, message="the job to run")
    # RQ's command finds the job through the worker RQ recorded as it started the work-horse.
    wait_for(lambda: Job.fetch(job_id, connection=conn, serializer=JSONSerializer).worker_name, 30,
             message="RQ to record the job's worker")
    send_stop_job_command(conn, job_id, serializer=JSONSerializer)
    final = wait_for(lambda: (s := states.status(conn, job_id))["state"] == "failed" and s, 60,
                     message="the stopped job to end")
    assert (final["outcome"], final["stopped"], final["canceled"], final["error"]) == \
        ("stopped", True, False, STOPPED_BY_RQ)
    assert final["history"][-1]["ended"] == STOPPED_BY_RQ

    run = CliRunner()
    assert "stopped by RQ's stop command" in run.invoke(main, ["status", job_id]).output
    assert json.loads(run.invoke(main, ["status", job_id, "--json"]).output)["outcome"] == "stopped"
    assert job_id in run.invoke(main, ["jobs", "--owner", OWNER, "--state", "stopped"]).output
    assert job_id not in run.invoke(main, ["jobs", "--owner", OWNER, "--state", "failed"]).output
    watched = run.invoke(main, ["watch", job_id])
    assert watched.exit_code == 1 and "stopped by RQ's stop command" in watched.output
    client = create_app_with().test_client()
    page = client.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert 'id="stopped-note"' in page and "state-stopped" in page
    assert samples(client.get("/metrics"))[("leash_jobs_stopped_total", (("kind", "hang"),))] == 1
