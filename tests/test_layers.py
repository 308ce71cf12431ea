"""The folders read as the layers, measured from the code's own imports (static, no import run).

An import counts when it runs: one under ``if TYPE_CHECKING:`` only names a type for the checker
and is left out. Every other import between ``jobs/`` modules is an arrow, wherever it stands
(module level or inside a function).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "jobs"

#: The longest chain of imports between jobs/ modules, in modules (a imports b imports c = 3): the
#: submission door (jobs.intake.submission) on the estimate, on a model's settings and spending,
#: on the budget, the meter and the settings.
LONGEST_CHAIN = 7
#: Modules and packages at the top of jobs/.
TOP_LEVEL = 19
#: What a status read (jobs.core.states) may never pull in: model calls and submission.
STATUS_MUST_NOT_REACH = ("jobs.models", "jobs.enqueue", "jobs.kinds", "jobs.intake", "jobs.deadletter")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in JOBS.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (n for child in node.orelse for n in _imports_of(child))
            continue
        yield from _imports_of(node)


def _imports_of(node: ast.AST):
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    else:
        yield from _imports(node)


def _targets(name: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    modules = _modules()
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in modules}
    if node.level:
        package = name.split(".") if _modules()[name].name == "__init__.py" else name.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    found = set()
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:  # `from jobs.core import lease`: the module
            found.add(f"{base}.{alias.name}")
        elif base in modules:  # `from jobs.core.lease import Attempt`: the module it comes from
            found.add(base)
    return found


@cache
def graph() -> dict[str, frozenset[str]]:
    arrows = {}
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(), filename=str(path))
        arrows[name] = frozenset(t for node in _imports(tree) for t in _targets(name, node) if t != name)
    return arrows


def _chain_from(start: str, arrows, memo, visiting) -> list[str]:
    if start in memo:
        return memo[start]
    assert start not in visiting, f"import circle through {start}: {' -> '.join([*visiting, start])}"
    visiting.append(start)
    best = max((_chain_from(t, arrows, memo, visiting) for t in arrows[start]), key=len, default=[])
    visiting.pop()
    memo[start] = [start, *best]
    return memo[start]


#: Modules counted as one in a chain, split only for size: jobs/keys/ is the one home of key names,
#: its modules areas of one namespace every caller reads through the package (``keys.job(job_id)``);
#: jobs.config reads the table of settings its declarations module holds.
ONE_MODULE = {"jobs.keys": "jobs.keys", "jobs.config.declarations": "jobs.config"}


def _as_one(name: str) -> str:
    return next((unit for part, unit in ONE_MODULE.items() if name == part or name.startswith(part + ".")), name)


def longest_chain() -> list[str]:
    arrows, memo = {}, {}
    for name, targets in graph().items():
        unit = _as_one(name)
        arrows.setdefault(unit, set()).update(t for t in map(_as_one, targets) if t != unit)
    return max((_chain_from(m, arrows, memo, []) for m in sorted(arrows)), key=len)


def reach(start: str) -> set[str]:
    arrows, seen, todo = graph(), set(), [start]
    while todo:
        for target in arrows[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_no_import_circle_and_the_longest_chain_is_short():
    chain = longest_chain()  # raises on a circle, naming it
    assert len(chain) <= LONGEST_CHAIN, "longest import chain: " + " -> ".join(chain)


def test_reading_a_status_needs_no_model_code_and_no_submission():
    reached = reach("jobs.core.states")
    bad = sorted(m for m in reached if m.startswith(STATUS_MUST_NOT_REACH))
    assert bad == [], f"jobs.core.states reaches {bad}"


def test_the_lifecycle_core_depends_on_nothing_above_it():
    """jobs/core/ imports only itself and the leaves every layer shares (settings, keys, errors,
    usage's ledger, the transitions): never a reader, a submission check, a model backend, the
    worker or the kinds."""
    allowed = ("jobs.core", "jobs.config", "jobs.keys", "jobs.errors", "jobs.usage", "jobs.lifecycle",
               "jobs.archive.pending", "jobs.webhooks.ending")
    core = {name for name in graph() if name == "jobs.core" or name.startswith("jobs.core.")}
    # its sub-packages are the core too: reaching Redis, the sweeps, what a running kind gets
    assert {"jobs.core.store.connection", "jobs.core.upkeep.reaper", "jobs.core.running.context"} <= core
    for name, targets in graph().items():
        if name in core:
            bad = sorted(t for t in targets if not t.startswith(allowed))
            assert bad == [], f"{name} imports {bad}"


def test_the_transitions_sit_below_every_layer_but_the_key_names():
    """jobs/lifecycle/ (the scripts and the transitions that run them) imports only jobs.keys."""
    for name, targets in graph().items():
        if name.startswith("jobs.lifecycle"):
            bad = sorted(t for t in targets if not t.startswith(("jobs.lifecycle", "jobs.keys")))
            assert bad == [], f"{name} imports {bad}"


def test_the_archive_noted_by_the_core_is_a_leaf():
    """jobs.archive.pending, where the core notes a job's end, imports only the key names."""
    bad = sorted(t for t in graph()["jobs.archive.pending"] if t != "jobs.keys")
    assert bad == [], f"jobs.archive.pending imports {bad}"


def test_the_webhook_note_of_the_core_is_a_leaf():
    """jobs.webhooks.ending, where the core notes a job's end for its webhook, imports only the key names."""
    bad = sorted(t for t in graph()["jobs.webhooks.ending"] if t != "jobs.keys")
    assert bad == [], f"jobs.webhooks.ending imports {bad}"


#: Modules one package under jobs/ may hold (its __init__.py not counted); past it, the package is
#: regrouped by what changes together (jobs/core/: the state machine, store/, upkeep/, running/).
PACKAGE_MODULES = 15


def test_no_package_holds_more_than_15_modules():
    packages = {init.parent: [p for p in init.parent.glob("*.py") if p.name != "__init__.py"]
                for init in JOBS.rglob("__init__.py")}
    assert JOBS / "core" / "upkeep" in packages
    crowded = {str(d.relative_to(ROOT)): len(m) for d, m in packages.items() if len(m) > PACKAGE_MODULES}
    assert crowded == {}, "regroup these packages by what changes together"


def test_few_modules_at_the_top_of_jobs():
    top = [p.name for p in JOBS.iterdir() if (p.suffix == ".py") or (p / "__init__.py").exists()]
    assert len(top) <= TOP_LEVEL, sorted(top)


def test_no_name_means_two_modules():
    """A module or package name is used once across jobs/, web/ and cli/ (``watch`` meaning a CLI
    command in one place and a schedule in another is how readers get lost)."""
    seen: dict[str, list[str]] = {}
    for folder in ("jobs", "web", "cli"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix == ".py" and path.name != "__init__.py":
                seen.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
            elif path.is_dir() and (path / "__init__.py").exists() and path != ROOT / folder:
                seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {n: p for n, p in seen.items() if len(p) > 1} == {}


#: What importing a bottom layer may load of leash: itself and the package (whose public names
#: are imported when first asked for). Run in a fresh interpreter: this one has loaded everything.
SETTINGS = {"jobs", "jobs.config", "jobs.config.declarations"}
BOTTOM_LAYERS = {"jobs.config": SETTINGS, "jobs.config.front": SETTINGS | {"jobs.config.front"},
                 "jobs.errors": {"jobs", "jobs.errors"}}
#: Libraries a bottom layer never loads: each costs a process start tenths of a second.
HEAVY = ("rq", "redis", "jsonschema", "flask", "limits", "sqlalchemy", "openai", "anthropic", "prometheus_client")


@pytest.mark.parametrize("module", sorted(BOTTOM_LAYERS))
def test_a_bottom_layer_loads_no_other_leash_module_and_no_heavy_library(module):
    probe = (f"import json, sys; import {module}; "
             "print(json.dumps(sorted(n for n in sys.modules if n == 'jobs' or n.startswith('jobs.') "
             f"or n.split('.')[0] in {HEAVY!r})))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert loaded - BOTTOM_LAYERS[module] == set(), f"import {module} loads {sorted(loaded - BOTTOM_LAYERS[module])}"


def _every_import(tree: ast.AST):
    """Every import, those for the type checker only too (``if TYPE_CHECKING:``)."""
    return (node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom))


def test_no_import_loop_even_for_the_type_checker():
    """A loop of imports, even through ``if TYPE_CHECKING:`` ones (a helper naming the class
    that calls it), means two modules that cannot be read or changed apart."""
    arrows = {}
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(), filename=str(path))
        arrows[name] = {t for node in _every_import(tree) for t in _targets(name, node) if t != name}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import loop: " + " -> ".join([*path[path.index(module):], module]))
        if module in done:
            return
        for target in sorted(arrows[module]):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(arrows):
        visit(module, [])


#: A Redis key name spelled in a string: leash's own or RQ's.
KEY_NAME = re.compile(r"""[fFrRbB]?["'](?:leash|rq):""")


def _names_keys(path: Path) -> list[str]:
    """Where a module imports the key names (jobs.keys) or spells one."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "jobs.keys" or node.module.startswith("jobs.keys.") or (
                    node.module == "jobs" and any(alias.name == "keys" for alias in node.names)):
                found.append(f"{node.lineno}: imports jobs.keys")
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: imports jobs.keys" for alias in node.names
                      if alias.name == "jobs.keys" or alias.name.startswith("jobs.keys.")]
    found += [f"{n}: {line.strip()[:60]}" for n, line in enumerate(path.read_text().splitlines(), 1)
              if KEY_NAME.search(line)]
    return found


def test_the_web_app_names_no_redis_key():
    """web/ reads and changes state through functions of jobs/ (jobs/read/, jobs/core/, ...):
    key names live in jobs/keys/ alone, and web/ neither imports nor spells one."""
    offenders = [f"{path.relative_to(ROOT)}:{where}" for path in sorted((ROOT / "web").rglob("*.py"))
                 for where in _names_keys(path)]
    assert offenders == []


#: Redis commands on keys (redis-py's method names): web/ asks jobs/ instead. (``get``, ``set`` and
#: ``delete`` are left out: dicts, sessions and forms have them too; a key they would need is
#: caught by the key-name guard above.)
REDIS_COMMANDS = frozenset({
    "blmove", "brpop", "blpop", "decr", "decrby", "eval", "evalsha", "execute_command", "exists",
    "expire", "expireat", "getdel", "getex", "hdel", "hexists", "hget", "hgetall", "hincrby", "hkeys", "hlen",
    "hmget", "hscan", "hset", "hsetnx", "hvals", "incr", "incrby", "incrbyfloat", "lindex", "linsert", "llen",
    "lmove", "lpop", "lpos", "lpush", "lrange", "lrem", "lset", "ltrim", "mget", "mset", "persist", "pexpire",
    "pipeline", "pttl", "rename", "rpop", "rpush", "sadd", "scan_iter", "scard", "setex", "setnx", "sismember",
    "smembers", "smismember", "srem", "sscan", "strlen", "ttl", "unlink", "zadd", "zcard", "zcount", "zincrby",
    "zpopmin", "zrange", "zrangebyscore", "zrank", "zrem", "zremrangebyscore", "zrevrange", "zscore",
})
#: The guarded client itself (web/redis_guard.py) wraps every command; it names none.
REDIS_CLIENT = ROOT / "web" / "redis_guard.py"


def _redis_calls(tree: ast.AST) -> list[str]:
    return [f"{node.lineno}: .{node.func.attr}(" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in REDIS_COMMANDS]


def test_the_web_app_sends_no_redis_command_itself():
    """web/ reads and changes leash's state through functions of jobs/, never by a command of its
    own on a key (rq-dashboard, mounted at /rq, is RQ's own)."""
    offenders = [f"{path.relative_to(ROOT)}:{where}" for path in sorted((ROOT / "web").rglob("*.py"))
                 if path != REDIS_CLIENT for where in _redis_calls(ast.parse(path.read_text()))]
    assert offenders == []


def test_the_key_name_guard_sees_both_ways_of_naming_a_key(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('from jobs import keys, kinds\nimport jobs.keys.job_keys\nx = f"leash:job:{1}"\ny = "rq:queue:a"\n')
    assert [where.split(":")[0] for where in _names_keys(sample)] == ["1", "2", "3", "4"]
    calls = ast.parse("with connection.pipeline() as pipe:\n    pipe.hset(k, 'a', 1)\nrequest.args.get('x')\n")
    assert _redis_calls(calls) == ["1: .pipeline(", "2: .hset("]
