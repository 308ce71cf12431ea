"""The request cache's answers in the archive: `leash submit --dry-run` counts them (from the
configured archive, or a `leash dev`'s own), a worker's hit from the archive marks the answer
used there (a dry run does not), and `leash usage --since` past 40 days is refused under
`leash dev`, whose workers archive."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import select, update

from cli import main
from cli.devrecord import archive_url, write_record
from jobs import keys
from jobs.archive import answers, database, sweep, tables
from jobs.enqueue import enqueue
from jobs.intake.submission import dry_run
from jobs.models import cache
from jobs.read.owners import SHARED_OWNER
from tests.conftest import REDIS_URL, run_burst
from tests.test_usage_workers import billed

TEMPLATE = "Say it back: {item}"
PORT = 5177  # the web port the `leash dev` of these tests records (nothing listens there)


@pytest.fixture(autouse=True)
def sweeps_by_hand(monkeypatch):
    """The in-process workers archive nothing themselves: each test moves answers when it means to."""
    monkeypatch.setattr(sweep, "tick", lambda connection: 0)


def _answers_archived(conn, url: str, lines: list[str], monkeypatch) -> None:
    """Run a job of ``lines`` as the shared owner, then move its answers to the archive at ``url``."""
    monkeypatch.setattr(cache, "archived", answers.lookup_to_use)
    enqueue(conn, "prompt", {"items": lines, "template": TEMPLATE}, owner=SHARED_OWNER)
    run_burst()
    assert answers.retire(conn, database.engine(url), now=time.time() + 3601) == len(lines)
    assert conn.zcard(keys.CACHE_INDEX) == 0


def _used_at(url: str) -> list[datetime]:
    with database.engine(url).connect() as sql:
        return [at.replace(tzinfo=UTC) if at.tzinfo is None else at
                for (at,) in sql.execute(select(tables.answers.c.used_at).order_by(tables.answers.c.entry))]


def _dry_run_cached(tmp_path, lines: list[str]) -> int:
    source = tmp_path / "items.txt"
    source.write_text("\n".join(lines))
    result = CliRunner().invoke(main, ["submit", "--kind", "prompt", "--template", TEMPLATE, "--dry-run", "--json",
                                       str(source)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["estimate"]["cached_items"]


def test_a_worker_hit_from_the_archive_marks_the_answer_used_and_a_dry_run_does_not(
        conn, model_server, env, tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    env.setenv("LEASH_ARCHIVE_URL", url)
    database.forget()
    lines = [f"line {n}" for n in range(4)]
    _answers_archived(conn, url, lines, monkeypatch)
    long_ago = datetime.now(UTC) - timedelta(days=20)
    with database.engine(url).begin() as sql:
        sql.execute(update(tables.answers).values(used_at=long_ago))
    # A dry run's price (the web app's and the CLI's hook) reads the answers, and uses none.
    monkeypatch.setattr(cache, "archived", answers.lookup)
    assert dry_run(conn, "prompt", {"items": lines, "template": TEMPLATE}, owner=SHARED_OWNER)["cached_items"] == 4
    assert all(abs(used - long_ago) < timedelta(seconds=1) for used in _used_at(url))
    # A worker's hits (`leash worker` sets lookup_to_use): each answer used is marked used now.
    monkeypatch.setattr(cache, "archived", answers.lookup_to_use)
    started = datetime.now(UTC) - timedelta(seconds=1)
    enqueue(conn, "prompt", {"items": lines[:3], "template": TEMPLATE}, owner=SHARED_OWNER)
    run_burst()
    assert billed(model_server)[0] == 4  # all three answered by the archive
    used = _used_at(url)
    assert sum(at >= started for at in used) == 3 and sum(abs(at - long_ago) < timedelta(seconds=1) for at in used) == 1
    # So the archive's expiry (LEASH_CACHE_DAYS after the last use) keeps what is in use.
    env.setenv("LEASH_CACHE_DAYS", "10")
    assert answers.expire(database.engine(url)) == 1 and len(_used_at(url)) == 3
    database.forget()


def test_leash_submit_dry_run_counts_the_answers_in_the_archive(conn, model_server, env, tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    env.setenv("LEASH_ARCHIVE_URL", url)
    database.forget()
    lines = [f"line {n}" for n in range(5)]
    _answers_archived(conn, url, lines[:3], monkeypatch)
    monkeypatch.setattr(cache, "archived", None)  # as a fresh `leash` process starts: the command sets it
    assert _dry_run_cached(tmp_path, lines) == 3
    database.forget()


def test_under_leash_dev_the_cli_reads_its_archive_for_dry_runs_and_usage(
        conn, model_server, env, tmp_path, monkeypatch):
    env.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    env.delenv("LEASH_ARCHIVE_URL", raising=False)
    env.delenv("DATABASE_URL", raising=False)
    url = archive_url(PORT)  # where `leash dev` on that port points its workers (LEASH_ARCHIVE_URL)
    os.makedirs(tmp_path / "state" / "leash" / f"dev-{PORT}")
    database.forget()
    lines = [f"dev line {n}" for n in range(4)]
    _answers_archived(conn, url, lines[:2], monkeypatch)
    monkeypatch.setattr(cache, "archived", None)
    usage = CliRunner().invoke(main, ["usage", "--since", "60d"])
    assert usage.exit_code == 0, usage.output  # no archive: the days stay in Redis for 400
    write_record(REDIS_URL, f"http://127.0.0.1:{PORT}", pid=os.getpid())
    env.delenv("REDIS_URL")  # the command finds the `leash dev`
    assert _dry_run_cached(tmp_path, lines) == 2
    usage = CliRunner().invoke(main, ["usage", "--since", "60d"])
    assert usage.exit_code == 2 and "kept 40 days" in usage.output and "--month" in usage.output
    assert CliRunner().invoke(main, ["usage", "--since", "30d"]).exit_code == 0
    env.setenv("REDIS_URL", REDIS_URL)  # the same Redis named outright: still that `leash dev`'s archive
    assert _dry_run_cached(tmp_path, lines) == 2
    assert CliRunner().invoke(main, ["usage", "--since", "60d"]).exit_code == 2
    database.forget()
