"""The leash command: submit, status, watch — and clear errors for bad input."""

from __future__ import annotations

import io
import json

from click.testing import CliRunner

from jobs import lease, states
from cli import main
from jobs.watch import poll_delay, watch_job


def run(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


def test_submit_prints_the_id_and_status_json_has_exactly_the_status_fields(conn):
    result = run("submit", "--labels", "positive,negative", "--json", "-", input="great\nawful\n\n")
    assert result.exit_code == 0, result.output
    job_id = json.loads(result.output)["job_id"]
    status = run("status", job_id, "--json")
    assert status.exit_code == 0
    fields = json.loads(status.output)
    assert tuple(fields) == states.FIELDS
    assert (fields["state"], fields["total"], fields["kind"]) == ("queued", 2, "classify")


def test_submit_with_the_same_idempotency_key_returns_the_same_job(conn):
    args = ("submit", "--labels", "a,b", "--owner", "ann", "--idempotency-key", "k1", "--json", "-")
    first = json.loads(run(*args, input="x\n").output)
    second = json.loads(run(*args, input="y\n").output)
    assert first["job_id"] == second["job_id"] and (first["created"], second["created"]) == (True, False)


def test_bad_input_is_a_message_and_exit_2_and_writes_nothing(conn):
    no_items = run("submit", "--labels", "a,b", "-", input="\n\n")
    assert no_items.exit_code == 2 and "'items' is empty" in no_items.output
    unknown_kind = run("submit", "--kind", "nope", "-", input="x\n")
    assert unknown_kind.exit_code == 2 and "unknown kind 'nope'" in unknown_kind.output
    assert conn.dbsize() == 0
    missing = run("status", "no-such-id")
    assert missing.exit_code == 2 and "no such job: no-such-id" in missing.output
    assert run("watch", "no-such-id").exit_code == 2


def test_watch_follows_a_job_to_its_end(conn):
    job_id = json.loads(run("submit", "--labels", "a,b", "--json", "-", input="x\n").output)["job_id"]
    attempt = lease.claim(conn, job_id, "leash", "w")
    attempt.heartbeat(item=(0, '"a"'))
    attempt.finish({"items": 1})
    result = run("watch", job_id)
    assert result.exit_code == 0
    assert "[##############################] 1/1 succeeded" in result.output


def test_watch_polls_every_second_for_ten_seconds_then_every_five():
    assert [poll_delay(t) for t in (0, 5, 9.9, 10, 60)] == [1, 1, 1, 5, 5]
    now = [0.0]
    slept = []
    fetches = iter([{"state": "running", "done": i, "total": 40, "attempts": 1, "max_attempts": 3}
                    for i in range(30)] + [{"state": "succeeded", "done": 40, "total": 40, "attempts": 1,
                                            "max_attempts": 3}])

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    final = watch_job(lambda: next(fetches), out=io.StringIO(), sleep=sleep, clock=lambda: now[0])
    assert final["state"] == "succeeded"
    assert slept[:10] == [1.0] * 10 and set(slept[10:]) == {5.0}


def test_a_bad_setting_in_the_environment_is_a_message_and_exit_2(conn, env):
    env.setenv("LEASH_LEASE_SECONDS", "soon")
    result = run("status", "anything")
    assert result.exit_code == 2
    assert "LEASH_LEASE_SECONDS must be a number, got 'soon'" in result.output
