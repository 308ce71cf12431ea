"""The failure report groups one bug into one line, whatever ids and numbers its messages carry."""

from __future__ import annotations

import json
import uuid

import pytest
from click.testing import CliRunner

from cli import main
from jobs import keys
from jobs.deadletter.failures import normalise, report
from jobs.deadletter.synthetic import FailedJob, traceback_text, write_failed_jobs

NOW = 1_800_000_000.0


@pytest.mark.parametrize("a, b", [
    ("TimeoutError: model call for job Q75GfE4G44jORau6W22Hchdd timed out after 12.5s",
     "TimeoutError: model call for job -x9_aBcDeFgHiJkLmNoPqRs timed out after 3s"),
    ("KeyError: 'item-42'", "KeyError: 'item-7'"),
    ("KeyError: 'label_1'", "KeyError: 'label_123456'"),
    ("PermanentError: rejected job aBcDeFgHiJkLmNoPqRsTuVwX", "PermanentError: rejected job 3bcDefGh1jklmnoPqrstuv-x"),
    ("RuntimeError: request c0800c51-dc32-4dae-aed3-18b6c9a13ba1 rejected",
     "RuntimeError: request 3ad9a817-04f9-497e-bcba-0ed7bf66dc6f rejected"),
    ("ConnectionError: Error 111 connecting to 10.0.3.7:6379.", "ConnectionError: Error 113 connecting to 10.0.9.12:6380."),
    ("OSError: cannot write /var/data/8812/out.json", "OSError: cannot write /var/data/17/out.json"),
    ("HTTPError: 503 from https://api.example.com/v1/jobs/88?try=2", "HTTPError: 503 from https://api.example.com/v1/jobs/1?try=9"),
    ("MemoryError: object at 0x7f3a2c1b9e80", "MemoryError: object at 0x55d1e2"),
    ("ValueError: sha 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b", "ValueError: sha 2c26b46b68ffc68ff99b453c1d30413413422d70"),
    ("SMTPError: mail to bob.smith@example.com bounced", "SMTPError: mail to a@b.io bounced"),
    ("lease expired 3.2s ago on worker 5f2c9e0b1d2a4c6e8f0a1b2c3d4e5f60: the worker stopped renewing it",
     "lease expired 120.0s ago on worker 0b1d2a4c6e8f0a1b2c3d4e5f605f2c9e: the worker stopped renewing it"),
])
def test_variable_parts_of_one_error_normalise_to_the_same_text(a, b):
    assert normalise(a) == normalise(b)


@pytest.mark.parametrize("a, b", [
    ("ValueError: invalid prompt", "KeyError: invalid prompt"),
    ("ConnectionRefusedError: model backend down", "ConnectionResetError: model backend down"),
    ("RuntimeError: sha256 mismatch", "RuntimeError: md5 mismatch"),
])
def test_different_errors_stay_apart(a, b):
    assert normalise(a) != normalise(b)


def test_normalised_text_is_at_most_80_characters_and_keeps_words():
    text = normalise("ValueError: " + "the prompt was rejected by the model " * 5)
    assert len(text) == 80
    assert text.startswith("ValueError: the prompt was rejected by the model the prompt")


def _jobs(kind, template, n, start, step=1.0):
    return [FailedJob(kind=kind, error=traceback_text(template.format(i=i, id=uuid.uuid4().hex)),
                      failed_at=start + i * step) for i in range(n)]


def test_report_groups_by_kind_and_normalised_error_biggest_first(conn):
    specs = (_jobs("classify", "TimeoutError: model call {i} timed out (request {id})", 30, NOW - 3000)
             + _jobs("classify", "KeyError: 'label-{i}'", 5, NOW - 2000)
             + _jobs("summarize", "TimeoutError: model call {i} timed out (request {id})", 12, NOW - 1000))
    ids = write_failed_jobs(conn, specs, now=NOW)

    result = report(conn, since=24 * 3600, now=NOW)

    assert result["total"] == 47
    summary = [(g["kind"], g["error"], g["count"]) for g in result["groups"]]
    assert summary == [
        ("classify", "TimeoutError: model call <n> timed out (request <id>)", 30),
        ("summarize", "TimeoutError: model call <n> timed out (request <id>)", 12),
        ("classify", "KeyError: 'label-<n>'", 5),
    ]
    biggest = result["groups"][0]
    assert biggest["first_seen"] == "2027-01-15T07:10:00.000Z"  # NOW - 3000
    assert biggest["last_seen"] == "2027-01-15T07:10:29.000Z"
    assert biggest["examples"] == ids[28:30]  # the two latest


def test_since_and_kind_narrow_the_report(conn):
    write_failed_jobs(conn, _jobs("classify", "ValueError: bad item {i}", 4, NOW - 7200)
                      + _jobs("classify", "ValueError: bad item {i}", 3, NOW - 600)
                      + _jobs("summarize", "ValueError: bad item {i}", 2, NOW - 600), now=NOW)

    assert report(conn, since=3600, now=NOW)["total"] == 5
    assert report(conn, since=None, now=NOW)["total"] == 9
    only = report(conn, since=3600, kind="summarize", now=NOW)
    assert [(g["kind"], g["count"]) for g in only["groups"]] == [("summarize", 2)]


def test_expired_jobs_are_pruned_from_the_failed_index_as_they_are_met(conn):
    ids = write_failed_jobs(conn, _jobs("classify", "ValueError: bad item {i}", 5, NOW - 100), now=NOW)
    conn.delete(keys.job(ids[0]), keys.job(ids[1]))  # what their TTL does after weeks

    assert report(conn, since=None, now=NOW)["total"] == 3
    assert conn.zcard(keys.FAILED_INDEX) == 3
    assert conn.zscore(keys.FAILED_INDEX, ids[0]) is None


def test_cli_prints_a_table_and_json(conn):
    write_failed_jobs(conn, [FailedJob(kind="classify", error=traceback_text(f"ValueError: bad item {i}"))
                             for i in range(3)])
    runner = CliRunner()

    table = runner.invoke(main, ["failures"])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0] == "3 failed jobs in 1 group, the last 1d"
    assert lines[1].split() == ["COUNT", "KIND", "FIRST", "SEEN", "LAST", "SEEN", "EXAMPLES", "ERROR"]
    assert lines[2].split()[0:2] == ["3", "classify"] and lines[2].endswith("ValueError: bad item <n>")

    as_json = runner.invoke(main, ["failures", "--since", "15m", "--json"])
    assert as_json.exit_code == 0
    assert json.loads(as_json.output)["groups"][0]["count"] == 3


@pytest.mark.parametrize("since", ["3x", "-5m", "0", "h", "24 hours"])
def test_cli_rejects_malformed_durations_with_exit_2(conn, since):
    result = CliRunner().invoke(main, ["failures", "--since", since])
    assert result.exit_code == 2
    assert "is not a duration" in result.output or "longer than zero" in result.output
