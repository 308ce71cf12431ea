"""The Lua scripts in jobs/lua/ are the ones something runs, one version of each, and their
shared helpers read only what they are given.

A script's identity is its text's SHA, as in RQ: a process reads its scripts once, when it
starts, and sends its own text (EVALSHA, loading it on NOSCRIPT). So a process of the previous
release runs the scripts it shipped whatever this tree holds (tests/test_upgrade.py takes them
from that release's commit), and a script is edited in place: no older version is kept beside
it, and a file no code of this release calls is dead text this test asks to delete.
"""

from __future__ import annotations

import re
from collections import defaultdict

from jobs.lifecycle import scripts

from .conftest import ROOT

CODE = [ROOT / "jobs", ROOT / "web", ROOT / "cli"]


def _called_by_code() -> set[str]:
    """Script names that appear as a string literal in jobs/, web/ or cli/ (how a call names one)."""
    quoted = re.compile(r"""["']([a-z][a-z0-9_]*_v\d+)["']""")
    return {name for package in CODE for path in package.rglob("*.py") for name in quoted.findall(path.read_text())}


def test_every_lua_script_is_called_by_the_code():
    dead = sorted(name for name in scripts.names() if name not in _called_by_code())
    assert dead == [], (
        f"jobs/lua/ holds scripts no code in jobs/, web/ or cli/ calls: {', '.join(f'{n}.lua' for n in dead)}. "
        "A running process sends its own scripts' text, so no other release needs them: delete them and note "
        "what they did in CHANGELOG.md (docs/ARCHITECTURE.md, 'Where a change goes').")


def test_each_script_has_one_version_in_the_tree():
    versions = defaultdict(list)
    for name in scripts.names():
        versions[re.sub(r"_v\d+$", "", name)].append(name)
    twice = {family: sorted(names) for family, names in versions.items() if len(names) > 1}
    assert twice == {}, (
        f"jobs/lua/ holds more than one version of a script: {twice}. Edit a script in place (its SHA is its "
        "identity: each release's processes send their own text) and delete the older file.")


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
