"""Every word leash says about a job agrees, on every surface: a walk through jobs in every
outcome -- succeeded, succeeded with item errors, failed by item errors, canceled, stopped by
RQ's stop command, answered from the request cache, batch mode -- reading each from the job
page, the status JSON, `leash status` (its text, its JSON and its exit code), `leash jobs`, My
jobs, `leash watch`'s exit code and /metrics, and finding them saying the same thing.

The jobs run on in-process workers against the loopback model server (tests/fake_openai.py:
an item "... -> x" is answered "x"; "x" off the labels is an item error after its correction);
the stopped job ends the way a worker ends one RQ's stop command reached (test_rq_stop.py runs
the command itself on a real worker)."""

from __future__ import annotations

import html
import json
import re

import pytest
from click.testing import CliRunner
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from cli import exit_codes, main
from cli.devfeed import _event
from jobs import keys
from jobs.core import lease, outcome
from jobs.core.outcome import STOPPED_BY_RQ
from jobs.enqueue import enqueue
from jobs.intake.submission import price_or_none
from tests.conftest import BATCH_POLL
from tests.fake_openai import MODEL
from tests.test_items_workers import ended
from tests.test_web_metrics import samples
from tests.web_support import HTML, create_app_with

pytestmark = pytest.mark.slow

OWNER = "shared"  # the owner of an open API and of the CLI without LEASH_API_TOKENS
LABELS = ["positive", "negative"]
#: What `leash watch` and `leash status` exit with for each outcome (cli/exit_codes.py).
EXIT = {outcome.SUCCEEDED: exit_codes.OK, outcome.WITH_ITEM_ERRORS: exit_codes.ITEM_ERRORS,
        outcome.FAILED: exit_codes.FAILED, outcome.CANCELED_OUTCOME: exit_codes.FAILED,
        outcome.STOPPED: exit_codes.FAILED}


def cli(*args):
    return CliRunner().invoke(main, list(args))


def classify(conn, items: list[str], **payload) -> str:
    payload = {"items": items, "labels": LABELS, **payload}
    job_id, _ = enqueue(conn, "classify", payload, owner=OWNER,
                        price=price_or_none(conn, "classify", payload, OWNER))
    return job_id


def make_jobs(conn, burst) -> dict[str, str]:
    answered = [f"review {i} -> positive" for i in range(4)]
    jobs = {"succeeded": classify(conn, answered)}
    burst()
    jobs["answered from the cache"] = classify(conn, answered)  # the same requests: every one cached
    jobs["succeeded with item errors"] = classify(conn, [*answered[:3], "review 9 -> neutral"], cache=False)
    jobs["failed by item errors"] = classify(conn, ["a -> neutral", "b -> neutral"], cache=False)
    jobs["batch mode"] = classify(conn, [f"batch {i} -> negative" for i in range(3)], mode="batch")
    burst(follow=30)
    canceled = classify(conn, ["never run -> positive"])
    assert cli("cancel", canceled).exit_code == 0
    jobs["canceled"] = canceled
    stopped = classify(conn, ["stopped -> positive"])
    # As a worker leaves a job RQ's stop command reached: taken off RQ's queue, failed in leash
    # (jobs/worker/leash_worker.py), stopped in RQ.
    conn.lrem(keys.rq_queue("leash"), 0, stopped)
    lease.claim(conn, stopped, "leash", "worker-1").fail(STOPPED_BY_RQ, permanent=True)
    Job.fetch(stopped, connection=conn, serializer=JSONSerializer).set_status(JobStatus.STOPPED)
    jobs["stopped by RQ"] = stopped
    for job_id in jobs.values():
        ended(conn, job_id)
    return jobs


def page_state(page: str) -> tuple[str, str]:
    """The job page's state badge: its class and its words."""
    found = re.search(r'<span id="state" class="state state-([a-z_]+)">([^<]*)</span>', page)
    assert found, page[:2000]
    return found.group(1), html.unescape(found.group(2)).strip()


def list_state(page: str, job_id: str) -> tuple[str, str]:
    """My jobs' row of the job: its badge's class and words."""
    row = next((r for r in page.split("<tr") if f"/jobs/{job_id}" in r), None)
    assert row is not None, f"{job_id} is not in My jobs"
    found = re.search(r'class="state state-([a-z_]+)">([^<]*)</span>', row)
    assert found, row
    return found.group(1), html.unescape(found.group(2)).strip()


def status_line(text: str, label: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith(label + " ")]
    assert lines, text
    return lines[0][len(label):].strip()


def test_every_surface_says_the_same_of_a_job_in_every_outcome(conn, burst, model_server, env):
    env.setenv("LEASH_BATCH_POLL_SECONDS", BATCH_POLL)
    env.setenv("LEASH_MODEL_PRICES", json.dumps({MODEL: {"input": 0.15, "output": 0.6}}))
    jobs = make_jobs(conn, burst)
    client = create_app_with().test_client()
    listed = cli("jobs", "--owner", OWNER, "--limit", "50")
    assert listed.exit_code == 0, listed.output
    my_jobs = client.get("/jobs?limit=50", headers=HTML).data.decode()
    api_list = {job["job_id"]: job for job in client.get("/jobs?limit=50").get_json()["jobs"]}
    cli_list = {job["job_id"]: job for job in map(json.loads, cli("jobs", "--owner", OWNER, "--limit", "50",
                                                                  "--json").stdout.splitlines())}
    expected = {"succeeded": outcome.SUCCEEDED, "answered from the cache": outcome.SUCCEEDED,
                "succeeded with item errors": outcome.WITH_ITEM_ERRORS, "failed by item errors": outcome.FAILED,
                "batch mode": outcome.SUCCEEDED, "canceled": outcome.CANCELED_OUTCOME,
                "stopped by RQ": outcome.STOPPED}
    seen: dict[str, dict] = {}
    for name, job_id in jobs.items():
        fields = client.get(f"/jobs/{job_id}").get_json()
        words = outcome.words(fields)
        page = client.get(f"/jobs/{job_id}", headers=HTML).data.decode()
        status = cli("status", job_id)
        as_json = json.loads(cli("status", job_id, "--json").stdout)
        watched = cli("watch", job_id)
        row = next((line for line in listed.stdout.splitlines() if line.startswith(job_id)), "")
        said = {
            "status JSON outcome": fields["outcome"],
            "leash status --json outcome": as_json["outcome"],
            "job page badge": page_state(page),
            "My jobs badge": list_state(my_jobs, job_id),
            "leash status state": status_line(status.stdout, "state"),
            "leash jobs row": words in row,
            "leash status exit": status.exit_code,
            "leash watch exit": watched.exit_code,
            "leash watch text": words in watched.output,
            "API list / leash jobs --json outcome": (api_list[job_id]["outcome"], cli_list[job_id]["outcome"]),
            "dev feed": words in (_event(None, fields) or ""),
            "item errors (JSON, leash status --json)": (fields["item_errors"], as_json["item_errors"]),
        }
        seen[name] = said
        want = expected[name]
        assert said["status JSON outcome"] == said["leash status --json outcome"] == want, (name, said)
        assert said["job page badge"] == (want, words), (name, said)
        assert said["My jobs badge"] == (want, words), (name, said)
        assert said["leash status state"].startswith(words), (name, said)
        assert said["leash jobs row"] and said["leash watch text"] and said["dev feed"], (name, words, said)
        assert said["API list / leash jobs --json outcome"] == (want, want), (name, said)
        assert said["leash status exit"] == said["leash watch exit"] == EXIT[want], (name, said)
        errors = 1 if name == "succeeded with item errors" else 2 if name == "failed by item errors" else 0
        assert said["item errors (JSON, leash status --json)"] == (errors, errors), (name, said)
        if want == outcome.WITH_ITEM_ERRORS:
            assert words == "succeeded with 1 of 4 item errors"
        if name == "failed by item errors":
            assert "2 of 2 items ended in an error" in fields["error"] and fields["error"] in html.unescape(page)
            assert "2 of 2 items ended in an error" in status.stdout
        if name == "answered from the cache":
            cached = "4 of 4 answered from the request cache (free)"
            assert fields["usage"]["cache_hits"] == 4 and fields["usage"]["calls"] == 0
            assert cached in page and cached in status.stdout and cached in list_row(my_jobs, job_id)
        if name == "batch mode":
            assert fields["mode"] == "batch" and as_json["batch"] == fields["batch"]
            assert (fields["batch"]["done"], fields["batch"]["total"]) == (3, 3)
            assert "batch" in page and "3 of 3" in page
    print("\n" + "\n".join(f"{name:28} {said}" for name, said in seen.items()))

    # /metrics counts each outcome apart, as many as the walk ended in it.
    found = samples(client.get("/metrics"))
    for want in outcome.ENDED:
        count = sum(1 for name in jobs if expected[name] == want)
        assert found.get((f"leash_jobs_{want}_total", (("kind", "classify"),)), 0) == count, (want, found)
    # And `leash jobs --state` finds each job under its own outcome only.
    for name, job_id in jobs.items():
        for view in outcome.ENDED:
            found = cli("jobs", "--owner", OWNER, "--state", view, "--limit", "50")
            shown = job_id in found.stdout
            assert shown == (view == expected[name]), (name, view, found.output, client.get(f"/jobs/{job_id}").get_json())


def list_row(page: str, job_id: str) -> str:
    return next(r for r in page.split("<tr") if f"/jobs/{job_id}" in r)
