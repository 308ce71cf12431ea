"""The Lua scripts in jobs/lua/ are the ones something runs, and their shared helpers read only
what they are given.

A process reads its scripts once, when it starts, and calls them by SHA: a script protects a
running process only if that process's code calls it. So a script stays while this release's
code calls it, or while the previous release (the one tests/test_upgrade.py upgrades from)
shipped it; any other is dead text, and this test asks for it to be deleted.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from jobs.lifecycle import scripts

from .conftest import ROOT
from .test_upgrade import PREVIOUS, PREVIOUS_COMMIT

CODE = [ROOT / "jobs", ROOT / "web", ROOT / "cli"]


def _previous_release_scripts() -> set[str]:
    """Script names in the previous release's jobs/lua/, from its commit. Never skipped: without
    git or the commit the test fails and says why."""
    try:
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{PREVIOUS_COMMIT}:jobs/lua"],
                                capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.fail("git is not installed: the Lua retirement rule reads the previous release's jobs/lua/ from git")
    if listed.returncode != 0:
        pytest.fail(f"cannot list jobs/lua/ of release {PREVIOUS} ({PREVIOUS_COMMIT[:12]}): "
                    f"{listed.stderr.strip()[:300]} -- a shallow clone leaves the commit out; clone with full history")
    names = {name.removesuffix(".lua") for name in listed.stdout.split() if name.endswith(".lua")}
    assert names, f"release {PREVIOUS} ({PREVIOUS_COMMIT[:12]}) lists no Lua script"
    return names


def _called_by_code() -> set[str]:
    """Script names that appear as a string literal in jobs/, web/ or cli/ (how a call names one)."""
    quoted = re.compile(r"""["']([a-z][a-z0-9_]*_v\d+)["']""")
    return {name for package in CODE for path in package.rglob("*.py") for name in quoted.findall(path.read_text())}


def test_every_lua_script_is_called_by_the_code_or_shipped_by_the_previous_release():
    kept = _called_by_code() | _previous_release_scripts()
    dead = sorted(name for name in scripts.names() if name not in kept)
    assert dead == [], (
        f"jobs/lua/ holds scripts no code in jobs/, web/ or cli/ calls and release {PREVIOUS} "
        f"({PREVIOUS_COMMIT[:12]}) did not ship: {', '.join(f'{n}.lua' for n in dead)}. No running process "
        "can call them (each reads its own scripts once, at start): delete them and note what they did in "
        "CHANGELOG.md (docs/ARCHITECTURE.md, 'Where a change goes').")


def test_every_script_the_code_calls_exists():
    missing = sorted(_called_by_code() - set(scripts.names()))
    assert missing == [], f"the code calls Lua scripts jobs/lua/ does not have: {missing}"


def test_the_shared_helpers_read_only_their_arguments():
    """A helper in _lib.lua that reads its caller's KEYS or ARGV ties itself to that caller's
    layout; it takes what it needs as arguments instead."""
    text = (scripts.LUA_DIR / "_lib.lua").read_text()
    reads = [f"_lib.lua:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
             if re.search(r"\bKEYS\s*\[|#KEYS\b|\bARGV\s*\[|#ARGV\b", line)]
    assert reads == [], "helpers take their keys and values as arguments:\n" + "\n".join(reads)
