"""The suite's `-n 4 --dist loadgroup` keeps each xdist group on one worker.

pytest-xdist marks a group by rewriting the test's node id; pytest 9.2 derives the node id from
another field, so with it every group is silently split across workers (pytest-xdist #1386) and
the upgrade tests build the previous release once per worker. This runs a small suite of its own
on two workers and fails if a group was split."""

from __future__ import annotations

import os
import subprocess
import sys

GROUPED = '''
import os, pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("n", range(6))
def test_grouped(n):
    with open(os.path.join(os.environ["GROUPED_OUT"], f"grouped-{n}"), "w") as out:
        out.write(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.parametrize("n", range(6))
def test_free(n):
    assert n >= 0
'''


def test_an_xdist_group_runs_on_one_worker(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "test_grouped.py").write_text(GROUPED)
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                          "--dist", "loadgroup"], cwd=suite, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "GROUPED_OUT": str(tmp_path)})
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    workers = {(tmp_path / f"grouped-{n}").read_text() for n in range(6)}
    assert len(workers) == 1, f"the group ran on {sorted(workers)}: pytest and pytest-xdist disagree on node ids"
