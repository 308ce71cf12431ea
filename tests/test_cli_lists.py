"""What the CLI's lists say about money and failures: a header row, tokens and cost with their
significant digits ("unknown", never "$?"), the HTTP status of a failure said plainly, and counts
that agree with their nouns."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from cli import main
from jobs.core import lease
from jobs.deadletter.synthetic import FailedJob, traceback_text, write_failed_jobs
from jobs.read.money import money
from jobs.usage.meter import Pending


def run(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


def submit(*items, name=None):
    extra = ("--name", name) if name else ()
    result = run("submit", "--labels", "a,b", *extra, "--json", "-", input="".join(i + "\n" for i in items))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["job_id"]


@pytest.mark.parametrize(("usd", "text"), [
    (None, "unknown"), (0, "$0"), (0.000037, "$0.000037"), (0.0000037, "$0.0000037"), (0.01234, "$0.01234"), (0.002019, "$0.002019"),
    (0.42, "$0.42"), (1.5, "$1.50"), (1234.5, "$1,234.50"),
])
def test_an_amount_keeps_its_significant_digits_and_an_unknown_one_says_so(usd, text):
    assert money(usd) == text


def test_leash_jobs_has_a_header_row_and_tokens_cost_and_duration_columns(conn, env):
    priced = submit("x", "y", name="Priced")
    unpriced = submit("z", name="Unpriced")
    for job_id, usage in ((priced, Pending("m", "classify", calls=2, input=30, output=7, nusd=37_000)),
                          (unpriced, Pending("m", "classify", calls=1, input=10, output=2, unpriced=1))):
        attempt = lease.claim(conn, job_id, "leash", "worker-1")
        attempt.heartbeat(item=(0, json.dumps("a")), usage=usage)
    listed = run("jobs")
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["JOB", "NAME", "KIND", "STATE", "DONE", "SUBMITTED", "DURATION", "TOKENS", "COST",
                                "ERROR"]
    [row] = [line for line in lines if priced in line]
    assert "37" in row.split() and "$0.000037" in row.split() and "1/2" in row.split()
    [row] = [line for line in lines if unpriced in line]
    assert "unknown" in row.split() and "$?" not in row
    assert not re.search(r"\$0\.0+(\s|$)", listed.stdout, re.M), "no amount rounded to nothing"
    # The header's columns line up with the rows': COST sits over the costs.
    column = lines[0].index("COST") + len("COST")
    assert row[:column].endswith("unknown")
    assert "2 of 2 jobs of owner shared" in listed.stderr


def test_leash_failures_says_the_http_status_and_counts_in_the_right_number(conn):
    url = "http://127.0.0.1:9/v1"
    write_failed_jobs(conn, [FailedJob(kind="classify", error=traceback_text(
        f"ModelUnavailable: the model server at {url} failed (HTTP 503): overloaded"))])
    table = run("failures")
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0] == "1 failed job in 1 group, the last 1d"
    assert "(HTTP 503)" in lines[2] and "(<n>)" not in lines[2]
