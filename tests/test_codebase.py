"""The architecture stays visible: lint-clean, small modules, one home for key names and Lua."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from jobs import scripts

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [ROOT / "jobs", ROOT / "web", ROOT / "cli"]


def python_files():
    for package in PACKAGES:
        yield from sorted(package.rglob("*.py"))


def test_the_code_is_lint_clean():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "jobs", "web", "cli", "scripts", "tests"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_modules_stay_under_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in python_files() if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}, "split these modules"


def test_redis_key_names_live_only_in_jobs_keys():
    literal = re.compile(r"""["'](leash|rq):[a-z_]+[:"']""")
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in python_files() if p.name != "keys.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if literal.search(line)]
    assert offenders == []


def test_every_lua_script_declares_its_keys_and_args_and_builds_no_key_names():
    for name in scripts.names():
        text = (scripts.LUA_DIR / f"{name}.lua").read_text()
        header = "\n".join(line for line in text.splitlines() if line.startswith("--"))
        assert re.search(r"_v\d+$", name), f"{name}: scripts carry a version suffix"
        assert "KEYS[1]" in header and "ARGV[1]" in header, f"{name}: KEYS/ARGV header missing"
        assert not re.search(r"['\"](leash|rq):", text), f"{name}: key names come in through KEYS"
