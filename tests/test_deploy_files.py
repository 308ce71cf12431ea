"""A push builds: the files Heroku's Python buildpack (and Dokku, and Render) read are there,
agree with pyproject.toml, and describe the processes the Procfile runs: app.json for Heroku
and Dokku, render.yaml for Render."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from importlib import metadata
from pathlib import Path

import jsonschema
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT
from tests.web_support import create_app_with

#: The package-manager files the buildpack knows; it refuses to build with none or several.
PACKAGE_MANAGER_FILES = ["requirements.txt", "uv.lock", "poetry.lock", "Pipfile.lock", "Pipfile"]
#: The extras requirements.txt installs besides the dependencies.
DEPLOYED_EXTRAS = ["sentry"]
REGENERATE = "regenerate it: scripts/pin-requirements"


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def deployed_requirements() -> dict[str, Requirement]:
    project = pyproject()["project"]
    lines = list(project["dependencies"])
    for extra in DEPLOYED_EXTRAS:
        lines += project["optional-dependencies"][extra]
    return {canonicalize_name(r.name): r for r in map(Requirement, lines)}


def pinned_file() -> tuple[dict[str, str], dict[str, list[str]], list[str]]:
    """requirements.txt as {name: version}, {name: the packages it is there for}, other lines."""
    pins: dict[str, str] = {}
    via: dict[str, list[str]] = {}
    others: list[str] = []
    current = None
    for raw in (ROOT / "requirements.txt").read_text().splitlines():
        line = raw.strip()
        if not line:
            continue
        if raw.startswith("    #"):  # uv's "via" annotations
            names = re.sub(r"^#\s*(via)?\s*", "", line)
            if current and names:
                via[current].append(names)
            continue
        if line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if match:
            current = canonicalize_name(match.group(1))
            pins[current] = match.group(2)
            via[current] = []
        else:
            others.append(line)
    return pins, via, others


def test_exactly_one_package_manager_file_sits_at_the_root():
    present = [name for name in PACKAGE_MANAGER_FILES if (ROOT / name).exists()]
    assert present == ["requirements.txt"]


def test_python_version_pins_311_which_pyproject_allows():
    assert (ROOT / ".python-version").read_text().strip() == "3.11"
    requires = pyproject()["project"]["requires-python"]
    assert requires == ">=3.11"


def test_requirements_txt_pins_the_versions_pyproject_toml_pins():
    pins, via, others = pinned_file()
    for name, requirement in deployed_requirements().items():
        assert name in pins, f"{requirement} is in pyproject.toml but not in requirements.txt; {REGENERATE}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"pyproject.toml wants {requirement}, requirements.txt pins {name}=={pins[name]}; {REGENERATE}")
    direct_in_file = {name for name, reasons in via.items() if any("leash (pyproject.toml)" in r for r in reasons)}
    assert direct_in_file == set(deployed_requirements()), f"direct dependencies differ; {REGENERATE}"
    # Everything pinned, then leash itself with the deployed extras (the Procfile's `leash`).
    assert others == [f".[{','.join(DEPLOYED_EXTRAS)}]"]


def test_every_package_leash_needs_at_run_time_is_pinned():
    """Walks the dependency tree as installed here: a new dependency whose own dependencies
    are missing from requirements.txt would install unpinned on the platform."""
    pins, _, _ = pinned_file()
    needed: set[str] = set()
    todo = list(deployed_requirements().values())
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in needed or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        needed.add(name)
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            raise AssertionError(f"{requirement.name} is not installed here: pip install -e '.[test]'") from None
        for line in requires:
            child = Requirement(line)
            if child.marker is None or child.marker.evaluate({"extra": ""}):
                todo.append(child)
    assert needed - set(pins) == set(), REGENERATE


def procfile() -> dict[str, str]:
    entries = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, command = line.partition(":")
            entries[name.strip()] = command.strip()
    return entries


def test_the_procfile_commands_are_installed_by_requirements_txt():
    commands = {shlex.split(command)[0] for command in procfile().values()}
    scripts = set(pyproject()["project"]["scripts"])
    pins, _, _ = pinned_file()
    assert commands == {"leash"}  # `leash web` serves with waitress, pinned with leash's dependencies
    assert "leash" in scripts and "waitress" in pins


def app_json() -> dict:
    return json.loads((ROOT / "app.json").read_text())


def test_app_json_matches_the_app_json_schema():
    schema = json.loads((ROOT / "tests" / "app_json_schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(app_json(), schema, cls=jsonschema.Draft202012Validator)


def test_a_schema_violation_is_caught():
    schema = json.loads((ROOT / "tests" / "app_json_schema.json").read_text())
    broken = app_json()
    broken["formation"]["web"]["quantity"] = "one"
    assert not jsonschema.Draft202012Validator(schema).is_valid(broken)


def test_app_json_runs_one_web_and_one_worker_on_heroku_redis():
    manifest = app_json()
    assert {name: spec["quantity"] for name, spec in manifest["formation"].items()} == {"web": 1, "worker": 1}
    assert set(manifest["formation"]) == set(procfile())
    assert any(str(addon.get("plan", addon) if isinstance(addon, dict) else addon).startswith("heroku-redis:")
               and (not isinstance(addon, dict) or addon.get("as", "REDIS") == "REDIS")
               for addon in manifest["addons"])  # attached as REDIS_URL, which leash reads


def test_app_json_generates_the_secret_and_requires_tokens_and_dashboard_credentials():
    env = app_json()["env"]
    assert env["SECRET_KEY"].get("generator") == "secret"
    for name in ("LEASH_API_TOKENS", "LEASH_DASHBOARD_USER", "LEASH_DASHBOARD_PASSWORD"):
        assert env[name]["required"] is True and env[name]["description"], name
        assert "value" not in env[name], f"{name} must be chosen at deploy time, not shipped"


def test_the_health_check_path_answers(conn):
    checks = app_json()["healthchecks"]["web"]
    paths = {check["path"] for check in checks if "path" in check}
    assert paths == {"/healthz"}
    client = create_app_with().test_client()
    assert client.get("/healthz").status_code == 200


def test_every_variable_in_app_json_is_one_leash_reads():
    source = "\n".join(p.read_text() for p in [*Path(ROOT, "jobs").rglob("*.py"), *Path(ROOT, "web").rglob("*.py")])
    unknown = [name for name in app_json()["env"] if f'"{name}"' not in source]
    assert unknown == []


def render_services() -> dict[str, dict]:
    blueprint = yaml.safe_load((ROOT / "render.yaml").read_text())
    return {service["type"]: service for service in blueprint["services"]}


def test_render_yaml_runs_the_procfile_commands_from_requirements_txt():
    services = render_services()
    assert {kind: services[kind]["startCommand"] for kind in ("web", "worker")} == procfile()
    for kind in ("web", "worker"):
        assert services[kind]["runtime"] == "python"
        assert services[kind]["buildCommand"] == "pip install -r requirements.txt"
        redis_url = next(v for v in services[kind]["envVars"] if v["key"] == "REDIS_URL")
        assert redis_url["fromService"] == {"type": "keyvalue", "name": services["keyvalue"]["name"],
                                            "property": "connectionString"}
    assert services["web"]["healthCheckPath"] == "/healthz"


def test_render_yaml_keeps_jobs_from_eviction_and_generates_the_secret():
    services = render_services()
    assert services["keyvalue"]["maxmemoryPolicy"] == "noeviction"
    assert services["keyvalue"]["ipAllowList"] == []
    web_env = {v["key"]: v for v in services["web"]["envVars"]}
    assert web_env["SECRET_KEY"] == {"key": "SECRET_KEY", "generateValue": True}
    for name in ("LEASH_API_TOKENS", "LEASH_DASHBOARD_USER", "LEASH_DASHBOARD_PASSWORD"):
        assert web_env[name] == {"key": name, "sync": False}  # asked for at deploy time


def test_secret_key_is_the_one_secret_every_recipe_and_doc_sets():
    """LEASH_SECRET_KEY is SECRET_KEY's deprecated name: no recipe sets it, the settings table
    and the changelog say it is deprecated, and the deploy docs name only SECRET_KEY."""
    assert "LEASH_SECRET_KEY" not in app_json()["env"]
    assert "LEASH_SECRET_KEY" not in {v["key"] for service in render_services().values()
                                      for v in service.get("envVars", [])}
    rows = [line for line in (ROOT / "docs" / "SETTINGS.md").read_text().splitlines() if "LEASH_SECRET_KEY" in line]
    assert rows and all(line.startswith("| `LEASH_SECRET_KEY` |") and "deprecated" in line for line in rows)
    unreleased = (ROOT / "CHANGELOG.md").read_text().split("\n## ", 2)[1]
    assert "`LEASH_SECRET_KEY` is deprecated" in unreleased
    assert "LEASH_SECRET_KEY" not in (ROOT / "docs" / "DEPLOY.md").read_text()
