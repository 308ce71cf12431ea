"""The leash command: submit, status, watch, results, cancel, jobs — and clear errors for bad input."""

from __future__ import annotations

import csv
import io
import json
import re
import time
from datetime import UTC, datetime

from click.testing import CliRunner
from rq.job import Job
from rq.serializers import JSONSerializer

from cli import job_commands, main, status_text
from cli.watch import JobLine, follow
from jobs.core import lease, states
from jobs.read.poll_schedule import poll_delay
from jobs.usage.meter import Pending


def run(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


def submit(*items, labels="a,b", extra=()):
    result = run("submit", "--labels", labels, *extra, "--json", "-", input="".join(i + "\n" for i in items))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["job_id"]


def test_submit_prints_the_id_and_the_web_address_and_status_json_has_the_status_fields(conn, env):
    env.setenv("LEASH_WEB_URL", "http://leash.example:8000/")
    result = run("submit", "--labels", "positive,negative", "-", input="great\nawful\n\n")
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert f"http://leash.example:8000/jobs/{job_id}" in result.stderr
    fields = json.loads(run("status", job_id, "--json").output)
    assert tuple(fields) == states.FIELDS
    assert (fields["state"], fields["total"], fields["kind"], fields["labels"]) == (
        "queued", 2, "classify", ["positive", "negative"])
    assert fields["results_url"] == f"/jobs/{job_id}/result"
    assert fields["waiting"] == "in the queue, waiting for a worker"


def test_submit_can_ask_for_fewer_items_in_flight_and_refuses_zero(conn, env):
    result = run("submit", "--labels", "a,b", "--item-concurrency", "2", "-", input="x\ny\n")
    assert result.exit_code == 0, result.output
    job = Job.fetch(result.stdout.strip(), connection=conn, serializer=JSONSerializer)
    assert job.args[1]["item_concurrency"] == 2
    refused = run("submit", "--labels", "a,b", "--item-concurrency", "0", "-", input="x\n")
    assert refused.exit_code == 2 and "--item-concurrency" in refused.output and "Traceback" not in refused.output


def test_submit_with_the_same_idempotency_key_returns_the_same_job(conn, env):
    args = ("submit", "--labels", "a,b", "--owner", "ann", "--idempotency-key", "k1", "--json", "-")
    first = json.loads(run(*args, input="x\n").output)
    second = json.loads(run(*args, input="y\n").output)
    assert first["job_id"] == second["job_id"] and (first["created"], second["created"]) == (True, False)


def test_bad_input_is_a_message_and_exit_2_and_writes_nothing(conn, env):
    no_items = run("submit", "--labels", "a,b", "-", input="\n\n")
    assert no_items.exit_code == 2 and "'items' is empty" in no_items.output
    unknown_kind = run("submit", "--kind", "nope", "-", input="x\n")
    assert unknown_kind.exit_code == 2 and "unknown kind 'nope'" in unknown_kind.output
    assert conn.dbsize() == 0
    missing = run("status", "no-such-id")
    assert missing.exit_code == 2 and "no such job: no-such-id (in the Redis at redis://" in missing.output
    for command in ("watch", "results", "cancel"):
        assert run(command, "no-such-id").exit_code == 2, command


def test_the_cli_is_the_shared_owner_by_default_and_must_name_one_when_tokens_are_set(conn, env):
    job_id = submit("x")
    assert conn.hget(f"leash:job:{job_id}", "owner") == b"shared"  # the API's and the browser's owner too
    env.setenv("LEASH_API_TOKENS", "alice=alice-token-0123456789")
    refused = run("submit", "--labels", "a,b", "-", input="x\n")
    assert refused.exit_code == 2 and "say whose jobs these are with --owner NAME or --token TOKEN" in refused.output
    assert run("jobs").exit_code == 2
    by_token = submit("y", extra=("--token", "alice-token-0123456789"))
    assert conn.hget(f"leash:job:{by_token}", "owner") == b"alice"
    wrong = run("submit", "--labels", "a,b", "--token", "not-a-token-at-all", "-", input="x\n")
    assert wrong.exit_code == 2 and "unknown --token" in wrong.output


def test_results_streams_every_item_with_its_input_as_jsonl_or_csv(conn, env, tmp_path):
    items = [f"item {n}, with a comma" for n in range(1000)]  # two pages of 500
    job_id = submit(*items)
    attempt = lease.claim(conn, job_id, "leash", "w")
    for n in range(0, 1000, 2):  # every other item done: a running job's partial results
        # Item 0's model calls: 2 calls, 30 tokens in, 4 out (the download shows them).
        usage = Pending("m", "classify", calls=2, input=30, output=4) if n == 0 else None
        attempt.heartbeat(item=(n, json.dumps("a")), usage=usage)
    lines = run("results", job_id)
    rows = [json.loads(line) for line in lines.stdout.splitlines()]
    assert len(rows) == 1000 and rows[0] == {"index": 0, "item": "item 0, with a comma", "result": "a",
                                             "usage": {"calls": 2, "input_tokens": 30, "output_tokens": 4,
                                                       "cache_hits": 0}}
    assert rows[999] == {"index": 999, "item": "item 999, with a comma", "result": None, "usage": None}
    assert "500 item(s) have no result yet" in lines.stderr
    out = tmp_path / "results.csv"
    assert run("results", job_id, "--format", "csv", "-o", str(out)).exit_code == 0
    table = list(csv.reader(out.open(encoding="utf-8")))
    assert table[0] == ["index", "item", "result", "calls", "input_tokens", "output_tokens", "cache_hits"]
    assert table[1] == ["0", "item 0, with a comma", "a", "2", "30", "4", "0"]
    assert len(table) == 1001 and table[2] == ["1", "item 1, with a comma", "", "", "", "", ""]


def test_results_as_csv_show_a_would_be_formula_as_text(conn, env, tmp_path):
    job_id = submit("=1+1", "-2")
    attempt = lease.claim(conn, job_id, "leash", "w")
    attempt.heartbeat(item=(0, json.dumps("@SUM(A1:A9)")))
    out = tmp_path / "results.csv"
    assert run("results", job_id, "--format", "csv", "-o", str(out)).exit_code == 0
    assert list(csv.reader(out.open(encoding="utf-8")))[1:] == [["0", "'=1+1", "'@SUM(A1:A9)", "", "", "", ""],
                                                                 ["1", "-2", "", "", "", "", ""]]
    assert json.loads(run("results", job_id).stdout.splitlines()[0])["item"] == "=1+1"


def test_cancel_shows_canceled_and_is_left_out_of_failures_and_alerts(conn, env):
    job_id = submit("x")
    result = run("cancel", job_id)
    assert result.exit_code == 0 and result.stdout.strip() == "canceled"
    fields = states.status(conn, job_id)
    assert (fields["state"], fields["canceled"]) == ("failed", True)
    assert "\nstate        canceled\n" in run("status", job_id).stdout
    again = run("cancel", job_id)
    assert again.exit_code == 1 and "already failed" in again.output
    assert "no failed jobs" in run("failures").output
    assert "canceled" in run("failures", "--include-canceled").output
    assert json.loads(run("alert", "--json").output)["failed"] == 0
    assert json.loads(run("alert", "--json", "--include-canceled").output)["failed"] == 1
    assert "canceled" in run("jobs").output


def test_jobs_lists_the_owners_jobs_newest_first_by_state(conn, env):
    first, second, third = submit("1"), submit("2"), submit("3")
    run("cancel", second)
    listed = run("jobs", "--json")
    assert [json.loads(line)["job_id"] for line in listed.stdout.splitlines()] == [third, second, first]
    canceled = run("jobs", "--state", "canceled", "--json")
    assert [json.loads(line)["job_id"] for line in canceled.stdout.splitlines()] == [second]
    assert json.loads(canceled.stdout)["state"] == "failed", "the state machine still says failed"
    assert run("jobs", "--state", "failed", "--json").stdout == "", "a canceled job is not a failure"
    limited = run("jobs", "--limit", "1")
    assert third in limited.stdout and first not in limited.stdout and "1 of 3 jobs" in limited.stderr
    assert run("jobs", "--owner", "somebody-else").stdout == ""


def test_watch_exits_0_when_the_job_succeeds_1_when_it_fails_130_when_interrupted(conn, env, monkeypatch):
    job_id = submit("x")
    attempt = lease.claim(conn, job_id, "leash", "w")
    attempt.heartbeat(item=(0, '"a"'))
    attempt.finish({"items": 1})
    done = run("watch", job_id)
    assert done.exit_code == 0 and done.stdout.startswith("100% 1/1 succeeded")
    canceled = submit("y")
    run("cancel", canceled)
    failed = run("watch", canceled)
    assert failed.exit_code == 1 and "canceled" in failed.stderr

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(job_commands, "follow", interrupted)
    stopped = run("watch", submit("z"))
    assert stopped.exit_code == 130 and "the job goes on" in stopped.stderr


def running(done, total=40, **extra):
    return {"state": "running", "done": done, "total": total, "attempts": 1, "max_attempts": 3, "stale": False,
            "items_per_second": 2.5, "eta_seconds": (total - done) / 2.5, "elapsed_seconds": done / 2.5,
            "error_summary": None, "canceled": False, "waiting": None} | extra


def test_the_watch_line_has_a_bar_percent_rate_eta_and_elapsed_and_never_wraps_in_80_columns():
    out = io.StringIO()
    line = JobLine(out, columns=80, tty=True)
    line.draw(running(10, stale=True, error_summary="TimeoutError: " + "the model did not answer " * 5))
    line.draw(running(30))
    line.close()
    drawn = out.getvalue()
    assert drawn.endswith("\033[?25h\n")  # the cursor click's redraws hide is shown again
    frames = re.sub(r"\033\[\?25[lh]", "", drawn).split("\r")[1:]
    assert len(frames) == 2
    for frame in frames:
        assert len(frame.rstrip("\n")) <= 79, frame
    first, second = frames
    assert first.startswith("[") and "10/40" in first and "25%" in first and "STALE" in first
    assert "2.5 items/s" in second and "ETA 0:04" in second and "elapsed 0:12" in second and "75%" in second
    # The error is cut at a word, not inside one; the next line covers it: nothing of it is left.
    assert first.rstrip().endswith("will be retried, 2.5…"), first
    assert len(second.rstrip("\n")) >= len(first.rstrip())


def test_watch_polls_every_second_for_ten_seconds_then_every_five():
    assert [poll_delay(t) for t in (0, 5, 9.9, 10, 60)] == [1, 1, 1, 5, 5]
    now = [0.0]
    slept = []
    fetches = iter([running(i) for i in range(30)] + [running(40, state="succeeded")])

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    final = follow(lambda: next(fetches), first=running(0), out=io.StringIO(), sleep=sleep, clock=lambda: now[0])
    assert final["state"] == "succeeded"
    assert slept[:10] == [1.0] * 10 and set(slept[10:]) == {5.0}


def test_a_bad_setting_in_the_environment_is_a_message_and_exit_2(conn, env):
    env.setenv("LEASH_LEASE_SECONDS", "soon")
    result = run("status", "anything")
    assert result.exit_code == 2
    assert "LEASH_LEASE_SECONDS must be a number, got 'soon'" in result.output


def test_submit_with_a_name_and_jobs_finds_it_by_search_and_kind(conn, env):
    named = submit("x", extra=("--name", "March reviews"))
    other = submit("y")
    assert json.loads(run("status", named, "--json").stdout)["name"] == "March reviews"
    found = run("jobs", "--search", "march")
    assert named in found.stdout and other not in found.stdout and "March reviews" in found.stdout
    assert "1 of 1 job of owner shared matching march" in found.stderr
    assert run("jobs", "--kind", "prompt").stdout == ""
    assert other in run("jobs", "--kind", "classify").stdout
    bad = run("submit", "--labels", "a,b", "--name", "a\tb", "-", input="x\n")
    assert bad.exit_code == 2 and "'name' must be one line of text" in bad.output


def test_status_for_people_is_in_words_with_the_whole_error_one_flag_away(conn, env):
    job_id = submit("x", "y", extra=("--name", "Support inbox"))
    attempt = lease.claim(conn, job_id, "leash", "worker-1")
    attempt.heartbeat(item=(0, '"a"'))
    url = "https://models.internal.example.com/v1/chat/completions?deployment=classifier-large"
    error = f"PermanentError: the model server at {url} refused the request because " + "it was " * 20
    attempt.fail(error + "\nTraceback (most recent call last):\n  File x", permanent=True)
    shown = run("status", job_id)
    assert shown.exit_code == 1, shown.output  # a failed job's status: exit status 1
    text = shown.stdout
    for word in ("None", "False", "True"):
        assert word not in text.split(), word
    assert f"job          {job_id}  (Support inbox)" in text
    assert "\nstate        failed\n" in text and "\nprogress     1 of 2 items (50%)" in text
    assert "\nattempts     1 (no retry: permanent error)\n" in text
    assert re.search(r"\nsubmitted    \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \((just now|\d+ s ago)\)\n", text)
    env.setenv("COLUMNS", "80")
    [error_line] = [line for line in run("status", job_id).stdout.splitlines() if line.startswith("error ")]
    # Cut at a word to fit the terminal, never inside the URL: here the URL does not fit.
    assert error_line == "error        PermanentError: the model server at… (whole text: --full)"
    env.setenv("COLUMNS", "160")
    [error_line] = [line for line in run("status", job_id).stdout.splitlines() if line.startswith("error ")]
    assert len(error_line) <= 160 and url in error_line and error_line.endswith(url + "… (whole text: --full)")
    assert "Traceback" not in text
    whole = run("status", job_id, "--full").stdout
    assert error.strip() in whole and "Traceback (most recent call last):" in whole
    assert json.loads(run("status", job_id, "--json").stdout)["error"].startswith("PermanentError")


def test_status_of_a_job_waiting_for_its_retry_says_in_how_long(conn, env):
    job_id = submit("x")
    lease.claim(conn, job_id, "leash", "w").fail("RuntimeError: 503", permanent=False)
    fields = states.status(conn, job_id)
    fields["next_retry_at"] = datetime.fromtimestamp(time.time() + 58.5, UTC).isoformat()
    text = "\n".join(status_text.lines(fields, "http://x/jobs/1"))
    assert re.search(r"next retry   \S+ \S+ UTC \(in 5[78] s\)", text)
    assert "attempts     1 of 3" in text


def test_a_missing_or_bad_option_is_named_by_its_flag_not_its_json_field(conn, env):
    missing = run("submit", "-", input="x\n")
    assert missing.exit_code == 2 and "--labels positive,negative" in missing.output and "'labels'" not in missing.output
    no_template = run("submit", "--kind", "prompt", "-", input="x\n")
    assert no_template.exit_code == 2 and "--template" in no_template.output
    duplicate = run("submit", "--labels", "a,a", "-", input="x\n")
    assert duplicate.exit_code == 2 and "--labels contains duplicates" in duplicate.output
