"""The quick chaos run (benchmarks/chaos.py --quick) as part of the normal test run: real workers
SIGKILLed, SIGTERMed and SIGSTOPped and a Redis restart, then every job checked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.mark.timeout(170)
def test_quick_chaos_run_loses_nothing_doubles_nothing_and_leaves_nothing_running():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--quick", "--seed", "7"],
                         cwd=ROOT, capture_output=True, text=True, timeout=160)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["violations"] == []
    assert result["succeeded"] == result["jobs"] - result["fail_jobs"]
    assert result["failed_as_built"] == result["fail_jobs"]
    performed = {e["kind"] for e in result["events"]}
    assert {"sigkill", "sigterm", "sigstop", "redis-restart"} <= performed
    assert result["reclaims"] >= 1
