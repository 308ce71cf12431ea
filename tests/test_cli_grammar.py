"""One grammar for every ``leash`` command: each answers ``--json``, one idea has one option name
(old spellings stay, hidden and deprecated), and the exit statuses are one table — the one
docs/CLI.md prints — used by every command: no Redis is 3 wherever it is found out, a failed
job's ``status`` is 1."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cli import exit_codes, main
from cli.devserver import free_port
from jobs.deadletter.synthetic import FailedJob, write_failed_jobs
from tests.conftest import ROOT

#: Commands that run until stopped and print logs, not an answer: they take no --json.
SERVERS = {"dev", "web", "worker"}
#: Old spellings of one idea, and the name every command uses for it now.
RENAMED = {"--count": "--limit", "--days": "--since", "--window": "--since", "--n": "--limit",
           "--max": "--limit", "--last": "--since"}


def leaf_commands(group: click.Group = main, prefix: str = "") -> list[tuple[str, click.Command]]:
    found = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += leaf_commands(command, f"{prefix}{name} ")
        else:
            found.append((prefix + name, command))
    return found


COMMANDS = leaf_commands()


def options(command: click.Command) -> list[click.Option]:
    ctx = click.Context(command)
    return [p for p in command.get_params(ctx) if isinstance(p, click.Option)]


def test_the_walk_finds_the_commands_people_use():
    names = {name for name, _ in COMMANDS}
    assert {"submit", "status", "watch", "results", "cancel", "jobs", "failures", "replay", "usage",
            "archive status"} <= names


@pytest.mark.parametrize("name,command", [(n, c) for n, c in COMMANDS if n not in SERVERS])
def test_every_command_answers_json(name, command):
    assert any("--json" in o.opts for o in options(command)), f"leash {name} has no --json"


@pytest.mark.parametrize("name,command", COMMANDS)
def test_no_command_shows_an_old_spelling_and_the_old_ones_are_hidden_and_deprecated(name, command):
    for option in options(command):
        for spelling in option.opts:
            if spelling in RENAMED:
                assert option.hidden and option.deprecated, (
                    f"leash {name} {spelling}: say {RENAMED[spelling]} (keep {spelling} hidden and deprecated)")


def test_old_spellings_still_work_and_say_the_new_one(conn):
    old = CliRunner().invoke(main, ["replay-log", "--count", "3", "--json"])
    assert old.exit_code == 0, old.output
    assert json.loads(old.stdout) == [] and "--limit" in old.stderr
    assert CliRunner().invoke(main, ["usage", "--days", "7", "--json"]).exit_code == 0
    assert CliRunner().invoke(main, ["usage", "--since", "7d", "--json"]).exit_code == 0


def test_version_is_the_package_version():
    result = CliRunner().invoke(main, ["--version"])
    text = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', text, re.M).group(1)
    assert result.exit_code == 0 and result.output.strip() == f"leash {version}"


def test_the_table_in_docs_cli_md_is_the_one_the_code_uses():
    doc = (ROOT / "docs" / "CLI.md").read_text()
    rows = re.findall(r"^\| `(\d+)` \| ([^|]+) \|", doc, re.M)
    assert [(int(code), meaning.strip()) for code, meaning in rows] == list(exit_codes.TABLE)
    assert "Exit status: 0 ok; 1 the job failed" in CliRunner().invoke(main, ["--help"]).output


def test_no_command_exits_with_a_bare_number():
    """Every status comes from cli/exit_codes.py, so one situation has one number everywhere."""
    for path in sorted((ROOT / "cli").glob("*.py")):
        if path.name == "exit_codes.py":
            continue
        text = path.read_text()
        assert not re.search(r"sys\.exit\(\d", text), f"{path.name}: sys.exit(<number>); use cli.exit_codes"
        assert not re.search(r"exit_code = \d", text), f"{path.name}: exit_code = <number>; use cli.exit_codes"


#: Arguments that get each command as far as asking Redis.
NEEDS_REDIS = [("submit", "--labels", "a,b", "-"), ("status", "x"), ("watch", "x"), ("results", "x"),
               ("cancel", "x"), ("jobs",), ("failures",), ("alert", "--max-failures", "1"), ("replay", "x"),
               ("replay-log",), ("usage",), ("doctor",), ("archive", "status"), ("pause", "leash"),
               ("resume", "leash"), ("quiet", "--all"), ("workers",), ("queue",), ("operator-log",),
               ("pipeline", "status", "x"), ("pipeline", "cancel", "x"), ("pipeline", "list")]


def test_the_walk_and_the_redis_list_cover_the_same_commands():
    assert {a[0] if a[0] not in ("archive", "pipeline") else " ".join(a[:2]) for a in NEEDS_REDIS} | SERVERS | {
        "archive migrate", "archive backfill", "archive months"} == {name for name, _ in COMMANDS}


@pytest.mark.parametrize("args", NEEDS_REDIS, ids=lambda a: " ".join(a[:2]))
def test_no_redis_is_exit_3_in_one_line_for_every_command(env, args):
    env.setenv("REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    result = CliRunner().invoke(main, list(args), input="x\n")
    assert result.exit_code == exit_codes.NO_REDIS, result.output
    assert "cannot reach Redis" in result.output and len(result.output.strip().splitlines()) == 1


def test_status_and_watch_of_a_failed_job_exit_1_and_of_a_queued_one_0(conn, env):
    [failed] = write_failed_jobs(conn, [FailedJob(kind="classify", error="ValueError: the item is bad")])
    for args in (("status", failed), ("status", failed, "--json"), ("watch", failed), ("watch", failed, "--json")):
        result = CliRunner().invoke(main, list(args))
        assert result.exit_code == exit_codes.FAILED, (args, result.output)
    assert json.loads(CliRunner().invoke(main, ["watch", failed, "--json"]).stdout)["state"] == "failed"
    submitted = CliRunner().invoke(main, ["submit", "--labels", "a,b", "--json", "-"], input="x\n")
    job_id = json.loads(submitted.stdout)["job_id"]
    assert CliRunner().invoke(main, ["status", job_id]).exit_code == exit_codes.OK
    canceled = CliRunner().invoke(main, ["cancel", job_id, "--json"])
    assert canceled.exit_code == 0 and json.loads(canceled.stdout)["canceled"] is True
    again = CliRunner().invoke(main, ["cancel", job_id, "--json"])
    assert again.exit_code == exit_codes.FAILED and json.loads(again.stdout)["canceled"] is False


def test_an_unknown_job_is_bad_input_exit_2(conn, env):
    for command in ("status", "watch", "results", "cancel"):
        result = CliRunner().invoke(main, [command, "no-such-job"])
        assert result.exit_code == exit_codes.BAD_INPUT and "no such job" in result.output


def test_the_job_of_a_provider_http_error_reads_http_and_its_number(conn):
    from jobs.models.provider import status_failure

    for status in (400, 401, 402, 403, 404, 422, 500, 503):
        failure = status_failure(status, "m", model="x", where="http://h", too_long=False, url_hint="u")
        assert f"(HTTP {status})" in failure.message and f" ({status})" not in failure.message
    assert Path(ROOT / "docs" / "CLI.md").is_file()


def test_leash_devs_quiet_log_lines_carry_an_errors_last_line_not_its_traceback():
    import io
    import logging

    from jobs.observability import logs

    for tracebacks, expect_traceback in ((False, False), (True, True)):
        out = io.StringIO()
        logger = logging.getLogger(f"leash.test.quiet.{tracebacks}")
        logger.propagate = False
        logger.addHandler(logs.make_handler("text", stream=out, tracebacks=tracebacks))
        try:
            raise RuntimeError("the model server at http://h failed (HTTP 503): down\nmore")
        except RuntimeError:
            logger.exception("job j1 failed")
        text = out.getvalue()
        assert ("Traceback" in text) is expect_traceback
        if not tracebacks:
            assert text.strip().endswith("job j1 failed (RuntimeError: the model server at http://h failed "
                                         "(HTTP 503): down)") and text.count("\n") == 1
