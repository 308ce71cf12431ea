"""The architecture stays visible: lint-clean, small modules, one home for key names and Lua."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from jobs.lifecycle import scripts

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [ROOT / "jobs", ROOT / "web", ROOT / "cli"]


def python_files():
    for package in PACKAGES:
        yield from sorted(package.rglob("*.py"))


def test_the_code_is_lint_clean():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "jobs", "web", "cli", "scripts", "benchmarks", "tests"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_modules_stay_under_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in python_files() if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}, "split these modules"


def test_every_module_a_script_or_test_runs_with_python_m_exists():
    import importlib.util

    run = re.compile(r"""["']-m["'],\s*["']([\w.]+)["']""")
    named = {m for folder in ("scripts", "benchmarks", "tests") for p in sorted((ROOT / folder).rglob("*.py"))
             for m in run.findall(p.read_text())}
    ours = sorted(m for m in named if m.split(".")[0] in {"cli", "jobs", "web", "scripts", "benchmarks", "tests"})
    assert "cli" in ours
    assert [m for m in ours if importlib.util.find_spec(m) is None] == []


#: The one package that names Redis keys, each of its modules an area (jobs/keys/__init__.py).
KEYS_PACKAGE = ROOT / "jobs" / "keys"


def test_redis_key_names_live_only_in_jobs_keys():
    literal = re.compile(r"""["'](leash|rq):[a-z_]+[:"']""")
    assert (KEYS_PACKAGE / "__init__.py").exists()
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in python_files() if KEYS_PACKAGE not in p.parents
                 for i, line in enumerate(p.read_text().splitlines(), 1) if literal.search(line)]
    assert offenders == []


def test_every_lua_script_declares_its_keys_and_args_and_builds_no_key_names():
    for name in scripts.names():
        text = (scripts.LUA_DIR / f"{name}.lua").read_text()
        header = "\n".join(line for line in text.splitlines() if line.startswith("--"))
        assert re.search(r"_v\d+$", name), f"{name}: scripts carry a version suffix"
        assert "KEYS[1]" in header and "ARGV[1]" in header, f"{name}: KEYS/ARGV header missing"
        assert not re.search(r"['\"](leash|rq):", text), f"{name}: key names come in through KEYS"


#: Outside jobs/config/, a setting is read through its typed group, never by name.
CONFIG_PACKAGE = ROOT / "jobs" / "config"


def _outside_the_config_package():
    return [p for p in python_files() if CONFIG_PACKAGE not in p.parents]


def test_only_jobs_config_reads_the_environment():
    reads = re.compile(r"os\.environ|os\.getenv|getenv\(")
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in _outside_the_config_package()
                 for i, line in enumerate(p.read_text().splitlines(), 1) if reads.search(line)]
    assert offenders == [], "read settings through jobs.config's typed groups (declare them there)"


def test_no_setting_is_read_by_name_outside_jobs_config():
    from jobs import config

    # get("X") / raw("X") / config.get("X"); a Flask app's app.config.get("X") is not a setting read.
    by_name = re.compile(r"""(?<![\w.])(?:config\.)?(?:get|raw)\(\s*["']([A-Z][A-Z0-9_]*)["']""")
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in _outside_the_config_package()
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if any(name in config.DECLARED for name in by_name.findall(line))]
    assert offenders == [], "read settings through jobs.config's typed groups (settings(), model_calls(), ...)"


#: Where every setting is listed (the README links to it).
SETTINGS_DOC = ROOT / "docs" / "SETTINGS.md"


def _settings_table_variables() -> set[str]:
    names = set()
    for line in SETTINGS_DOC.read_text().splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]))
    return names


def test_the_settings_tables_list_exactly_the_declared_settings():
    from jobs import config

    documented = {name for name, setting in config.DECLARED.items() if setting.documented}
    listed = _settings_table_variables()
    assert sorted(documented - listed) == [], "declared but missing from docs/SETTINGS.md's tables"
    assert sorted(listed - documented) == [], "in docs/SETTINGS.md's tables but not declared in jobs/config/"


def test_every_cli_environment_variable_is_a_declared_setting():
    from cli.option_defaults import DEFAULTS
    from jobs import config

    used = {name for p in (ROOT / "cli").rglob("*.py") for name in re.findall(r'setting="([A-Z0-9_]+)"', p.read_text())}
    assert used and sorted(used - set(config.DECLARED)) == []
    assert sorted(used ^ set(DEFAULTS)) == [], "each option's setting has one row in cli/option_defaults.py"


def test_an_option_without_a_declared_variable_is_not_read_from_the_environment(conn, env):
    # click's auto_envvar_prefix would read LEASH_SUBMIT_KIND, LEASH_REPLAY_YES, ... unseen.
    import json

    from click.testing import CliRunner

    from cli import main
    from jobs.core import states

    env.setenv("LEASH_SUBMIT_KIND", "prompt")
    env.setenv("LEASH_SUBMIT_MAX_ATTEMPTS", "9")
    result = CliRunner().invoke(main, ["submit", "--labels", "a,b", "--json", "-"], input="x\n")
    assert result.exit_code == 0, result.output
    fields = states.status(conn, json.loads(result.stdout)["job_id"])
    assert (fields["kind"], fields["max_attempts"]) == ("classify", 3)


def test_a_bad_setting_is_one_line_naming_it():
    import pytest

    from jobs import config

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEASH_LEASE_SECONDS", "soon")
        with pytest.raises(ValueError, match=r"^LEASH_LEASE_SECONDS must be a number, got 'soon'$"):
            config.check_all()
        mp.setenv("LEASH_LEASE_SECONDS", "0.1")
        with pytest.raises(ValueError, match=r"^LEASH_LEASE_SECONDS must be at least 0.5, got 0.1$"):
            config.settings()


def test_every_exception_leash_defines_is_an_error_or_a_signal_never_both():
    """An ``except LeashError`` catches every failure leash raises and never a signal: the
    control flow that is no failure (jobs.errors' docstring says which and why)."""
    import importlib
    import inspect
    import pkgutil

    from jobs.errors import LeashError, Signal

    defined = {}
    for info in pkgutil.walk_packages([str(ROOT / "jobs")], "jobs."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name:
                defined[f"{info.name}.{name}"] = value
    assert "jobs.models.calls.ModelUnavailable" in defined and "jobs.errors.HandOff" in defined
    neither = sorted(n for n, c in defined.items() if not issubclass(c, LeashError | Signal))
    both = sorted(n for n, c in defined.items() if issubclass(c, LeashError) and issubclass(c, Signal))
    assert (neither, both) == ([], [])
