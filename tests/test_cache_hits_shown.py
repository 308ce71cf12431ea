"""Cache hits where usage is shown: a job answered from the request cache says "N of M answered
from the request cache (free)" on its page, in `leash status`, the dev feed, My jobs and
`leash usage` (a column), never "no model calls yet"."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cli import main
from cli.devfeed import _event
from jobs.core import states
from tests.test_request_cache import items, run, worker  # noqa: F401 - the fixture
from tests.web_support import HTML, create_app_with

pytestmark = pytest.mark.slow


def test_a_job_answered_from_the_cache_says_so_wherever_usage_is_shown(conn, worker):  # noqa: F811
    run(conn, items(0, 3), owner="shared")
    partly = run(conn, items(0, 5), owner="shared")  # 3 of its 5 were asked before
    whole = run(conn, items(0, 5), owner="shared")
    assert partly["usage"]["cache_hits"] == 3 and whole["usage"]["calls"] == 0

    words = "5 of 5 answered from the request cache (free)"
    status = CliRunner().invoke(main, ["status", whole["job_id"]]).output
    assert words in status and "no model calls yet" not in status, status
    assert "3 of 5 answered from the request cache (free)" in CliRunner().invoke(
        main, ["status", partly["job_id"]]).output
    client = create_app_with().test_client()
    page = client.get(f"/jobs/{whole['job_id']}", headers=HTML).data.decode()
    assert words in page and "no model calls yet" not in page
    assert words in client.get("/jobs", headers=HTML).data.decode()
    assert words in _event(None, states.status(conn, whole["job_id"]))
    usage = CliRunner().invoke(main, ["usage", "--owner", "shared", "--since", "1d"]).output
    assert "cache (free)" in usage.splitlines()[0]
    assert usage.splitlines()[-1].split()[-2] == "8", usage  # the total's cache column: 3 + 5
