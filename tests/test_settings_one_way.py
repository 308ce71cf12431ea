"""Settings are read one way, measured from the source: the web app's modules read theirs from
web/app_settings.py (the typed groups, read once per app), never from Flask's ``app.config``
under a name of leash's; the command line's options that are settings take their defaults from
the typed groups (cli/option_defaults.py), never from click reading the environment; the
environment is read only in jobs/config (tests/test_codebase.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from flask import Flask

from jobs.config import DECLARED
from tests.conftest import ROOT

WEB = ROOT / "web"
CLI = ROOT / "cli"
#: The one module of web/ that reads the typed groups.
WEB_SETTINGS = WEB / "app_settings.py"


def _modules(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(), filename=str(path))


def _imported(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _config_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``<x>.config["NAME"]`` and ``<x>.config.get("NAME")`` read (not written), with their lines."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                and isinstance(node.value, ast.Attribute) and node.value.attr == "config"
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
            found.append((node.lineno, node.slice.value))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "config"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
    return found


def _leash_setting(name: str) -> bool:
    """A name of leash's, declared or its own; Flask's own keys that are not settings are not."""
    return name in DECLARED or name.startswith("LEASH_") or name not in Flask.default_config


def test_only_web_app_settings_reads_the_typed_groups():
    offenders = [str(p.relative_to(ROOT)) for p in _modules(WEB) if p != WEB_SETTINGS
                 and any(name == "jobs.config" or name.startswith("jobs.config.") for name in _imported(_tree(p)))]
    assert offenders == [], "web/ reads its settings from web/app_settings.py (app_settings.current())"


def test_no_web_module_reads_a_leash_setting_from_flask_config():
    offenders = [f"{p.relative_to(ROOT)}:{line} {name}" for p in _modules(WEB)
                 for line, name in _config_reads(_tree(p)) if _leash_setting(name)]
    assert offenders == [], "read leash's settings from app_settings.current(), not Flask's app.config"


#: ``config.NAME`` or ``config["NAME"]`` in a template (Jinja's view of Flask's app.config).
TEMPLATE_CONFIG = re.compile(r"""\bconfig(?:\.([A-Za-z_][A-Za-z0-9_]*)|\[\s*["']([A-Za-z_][A-Za-z0-9_]*)["']\s*\])""")


def _template_config_reads(text: str) -> list[str]:
    return [dotted or quoted for dotted, quoted in TEMPLATE_CONFIG.findall(text)]


def test_no_template_reads_a_leash_setting_from_flask_config():
    offenders = [f"{p.relative_to(ROOT)} {name}" for p in sorted((WEB / "templates").rglob("*.html"))
                 for name in _template_config_reads(p.read_text()) if _leash_setting(name)]
    assert offenders == [], "a page is handed what it shows (a template global or the view's arguments)"


def _click_reads_the_environment(tree: ast.AST) -> list[tuple[int, str]]:
    """``envvar=``/``auto_envvar_prefix=`` given to click, or an ``auto_envvar_prefix`` key."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in ("envvar", "auto_envvar_prefix"):
            found.append((node.value.lineno, node.arg))
        elif isinstance(node, ast.Dict):
            found += [(key.lineno, key.value) for key in node.keys
                      if isinstance(key, ast.Constant) and key.value == "auto_envvar_prefix"]
    return found


def test_no_cli_option_is_read_from_the_environment_by_click():
    offenders = [f"{p.relative_to(ROOT)}:{line} {what}" for p in _modules(CLI)
                 for line, what in _click_reads_the_environment(_tree(p))]
    assert offenders == [], "an option that is a setting is a setting_option (cli/option_defaults.py)"


def test_the_guards_see_what_they_look_for():
    """The guards' own measures find a read and an import when there is one."""
    sample = ast.parse('from jobs.config.front import web_app\nx = app.config["LEASH_DEV"]\n'
                       'y = current_app.config.get("SECRET_KEY")\napp.config["RQ_DASHBOARD_REDIS_URL"] = 1\n'
                       'z = app.config["MAX_CONTENT_LENGTH"]\n')
    assert "jobs.config.front" in _imported(sample)
    assert [name for _, name in _config_reads(sample) if _leash_setting(name)] == ["LEASH_DEV", "SECRET_KEY"]
    assert _template_config_reads('{% if config.LEASH_X %}{{ config["SECRET_KEY"] }}{{ config.MAX_CONTENT_LENGTH }}') \
        == ["LEASH_X", "SECRET_KEY", "MAX_CONTENT_LENGTH"]
    options = ast.parse('@click.option("--x", envvar="X")\n@click.group(context_settings={"auto_envvar_prefix": "A"})\n'
                        'def f(): pass\n')
    assert [what for _, what in _click_reads_the_environment(options)] == ["envvar", "auto_envvar_prefix"]
