"""The suite's `-n 4 --dist loadgroup` keeps each xdist group on one worker, and every test
that uses a fixture costly to set up (Chromium, the previous release's build) is in its group.

pytest-xdist marks a group by rewriting the test's node id; pytest 9.2 derives the node id from
another field, so with it every group is silently split across workers (pytest-xdist #1386) and
the upgrade tests build the previous release once per worker. This runs a small suite of its own
on two workers and fails if a group was split."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # each runs pytest in a process of its own

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


LISTER = '''
import sys

def pytest_collection_finish(session):
    for item in session.items:
        groups = sorted(m.args[0] for m in item.iter_markers("xdist_group"))
        sys.stdout.write(f"ITEM {item.nodeid} {','.join(item.fixturenames)} {','.join(groups)}\\n")
'''

#: A fixture that is costly to set up once per worker, and the group whose tests share it.
SHARED = {"chromium": "browser", "previous_bin": "upgrade"}


def test_every_test_using_a_costly_shared_fixture_is_in_its_group(tmp_path):
    (tmp_path / "list_groups.py").write_text(LISTER)
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-p", "list_groups", "tests"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    items = [line.split(" ")[1:] + [""] for line in listed.stdout.splitlines() if line.startswith("ITEM ")]
    users = {fixture: [] for fixture in SHARED}
    for nodeid, fixtures, groups, *_ in items:
        for fixture, group in SHARED.items():
            if fixture in fixtures.split(","):
                users[fixture].append(nodeid)
                assert groups.split(",") == [group], f"{nodeid} uses {fixture} outside xdist group {group!r}"
    assert all(users.values()), f"no test uses one of {list(SHARED)}: update SHARED"
