"""An upgrade in place, with work in flight: the previous release (``PREVIOUS``, from its commit,
installed from ``git archive`` into a virtual environment of its own) runs workers against
Redis and takes submissions; this release's workers join while the old ones still run, the old
ones are stopped by SIGTERM (a deploy), and this release finishes everything.

What must hold afterwards (docs/OPERATIONS.md, "Upgrading"): every job ends in its true state
with all its items; no item's model call is paid twice; an idempotent submission repeated
through this release returns the job the previous release made; attempt histories of jobs the
previous release ran read right; no ``leash:*`` key is left without an expiry except the ones
meant to be permanent (``jobs.keys.PERMANENT``); a job that failed under the previous release
is replayed by this one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from jobs import enqueue, keys
from jobs.core import clock, details, state_index, states

from .conftest import ROOT, wait_for
from .fake_openai import Error

#: The release this one promises to upgrade from in place, and the commit it was made from.
#: The commit is what the test uses: it is in main's history, so every clone of main has it,
#: while a tag travels only when tags are pushed and fetched.
PREVIOUS = "v0.2.0"
PREVIOUS_COMMIT = "31b80626470381891c29b00964d744f7f77f5b83"

pytestmark = pytest.mark.slow


def _git(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=timeout)


def _has_previous() -> bool:
    return _git("cat-file", "-e", f"{PREVIOUS_COMMIT}^{{commit}}").returncode == 0


def _ensure_previous() -> None:
    """The previous release's commit in this repository (fetched once if a shallow clone left it
    out). Never skipped: without it the test fails and says why."""
    if _has_previous():
        return
    fetched = _git("fetch", "--no-tags", "origin", PREVIOUS_COMMIT, timeout=120)
    if fetched.returncode != 0 or not _has_previous():
        pytest.fail(f"the commit of release {PREVIOUS} ({PREVIOUS_COMMIT[:12]}) is not in this repository and "
                    f"`git fetch origin {PREVIOUS_COMMIT[:12]}` failed ({fetched.stderr.strip()[:300]}): a shallow "
                    "clone leaves it out; clone with full history")


def previous_script(name: str) -> str:
    """The text of a Lua script as the previous release shipped it, from its commit: what its
    processes send to Redis (each release runs its own scripts; this tree keeps only its own)."""
    _ensure_previous()
    shown = _git("show", f"{PREVIOUS_COMMIT}:jobs/lua/{name}.lua")
    assert shown.returncode == 0, f"release {PREVIOUS} has no jobs/lua/{name}.lua: {shown.stderr.strip()[:300]}"
    return shown.stdout


def _previous_tree(dest: Path) -> Path:
    """The previous release's files, from its commit."""
    _ensure_previous()
    archive = dest / "previous.tar"
    made = _git("archive", "--format=tar", "-o", str(archive), PREVIOUS_COMMIT)
    assert made.returncode == 0, made.stderr
    tree = dest / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


@pytest.fixture(scope="module")
def previous_bin(tmp_path_factory) -> Path:
    """The previous release installed in its own virtual environment; returns its bin folder.
    Its dependencies are the pinned ones this environment has, so pip's cache has them all."""
    root = tmp_path_factory.mktemp("previous-release")
    tree = _previous_tree(root)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(tree)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    return venv / "bin"


def _previous_env(home: Path) -> dict:
    """The environment the previous release runs in: this test's settings, none of this
    checkout's code (no PYTHONPATH, no job kinds of the tests)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LEASH_IMPORTS")}
    env["HOME"] = str(home)
    return env


class Previous:
    """The previous release's `leash` command."""

    def __init__(self, bin_dir: Path, home: Path):
        self.leash = str(bin_dir / "leash")
        self.home = home
        self.env = _previous_env(home)

    def submit(self, name: str, items: list[str], owner: str, key: str, *extra: str) -> str:
        done = subprocess.run([self.leash, "submit", "--kind", "prompt", "--template", "{item}", "--owner", owner,
                               "--idempotency-key", key, *extra, "-"], input="\n".join(items) + "\n",
                              capture_output=True, text=True, env=self.env, cwd=self.home, timeout=60)
        assert done.returncode == 0, f"{name}: {done.stderr}"
        return done.stdout.strip()


def _this_release(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "cli", *args], input=stdin, capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)


def _stopped_like_a_platform(proc: subprocess.Popen, grace: float = 15) -> None:
    """Wait for a SIGTERMed worker to exit; past the previous release's promise (its hand-off
    grace + 5 s) send SIGKILL, as Heroku does after 30 s: that release's worker could wait
    forever on a scheduler restarted during its shutdown (fixed since). Its running job was
    handed back before that wait, and what it did not hand back the new workers reclaim."""
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _field(conn, job_id: str, name: str) -> str | None:
    value = conn.hget(keys.job(job_id), name)
    return value.decode() if value is not None else None


def _calls_per_prompt(server) -> dict[str, int]:
    counts: dict[str, int] = {}
    for seen in list(server.requests):
        counts[seen.item] = counts.get(seen.item, 0) + 1
    return counts


def _keys_without_expiry(conn, job_id: str = "") -> list[str]:
    """``leash:`` keys (of one job, if given) kept without an expiry, the permanent ones aside."""
    pattern = keys.PREFIX + (f"*{job_id}*" if job_id else "*")
    return sorted(key.decode() for key in conn.scan_iter(match=pattern, count=1000)
                  if conn.ttl(key) == -1 and not keys.is_permanent(key.decode()))


# Its deadline counts the first test's build of the previous release (half a minute alone, two on
# a loaded machine) and some twenty `leash` processes: past 300 s when two suites share 2 cores.
@pytest.mark.timeout(600)
def test_upgrade_in_place_with_work_in_flight(previous_bin, conn, workers, model_server, env, tmp_path):
    # Leases far longer than the suite's 2 s: a deploy starting processes on a busy machine (the
    # whole suite on two cores stalled an old work-horse past 5 s) must not look like a dead
    # worker, whose reclaim would redo the call in flight: legitimate, but not an upgrade's doing.
    env.setenv("LEASH_LEASE_SECONDS", "15")
    env.setenv("LEASH_RETRY_BACKOFF", "6")
    env.setenv("LEASH_OWNER_CONCURRENCY", "1")  # a second job of an owner waits: queued at the upgrade
    # The long jobs must still be running when the later jobs are checked queued: 120 items at
    # 8 at once take 6 s at 0.4 s a call (1.5 s at 0.1 s, which a loaded machine's polling missed).
    model_server.latency = 0.4
    old = Previous(previous_bin, tmp_path)
    items = {name: [f"{name}-{i}" for i in range(n)] for name, n in
             (("failing", 3), ("retrying", 5), ("long-a", 120), ("long-b", 120), ("long-c", 120),
              ("later-a", 4), ("later-b", 4), ("from-new", 3))}
    model_server.on("failing-1", Error(400, "the request names no model"))  # permanent: failed under 0.2
    model_server.on("retrying-2", Error(503, "overloaded"))  # one failed attempt, then a retry
    owners = {"failing": "dave", "retrying": "carol", "long-a": "alice", "long-b": "bob", "long-c": "erin",
              "later-a": "alice", "later-b": "bob", "from-new": "frank"}
    extra = {"failing": ("--max-attempts", "1")}

    # One old worker runs RQ's retry scheduler (the retrying job needs it), as in a deployment.
    old_workers = [workers.start_program([old.leash, "worker", "--log-level", "WARNING",
                                          "--scheduler" if n == 0 else "--no-scheduler"], env=old.env, cwd=tmp_path)
                   for n in range(4)]
    jobs = {}
    for name in ("failing", "retrying"):
        jobs[name] = old.submit(name, items[name], owners[name], f"key-{name}", *extra.get(name, ()))
    wait_for(lambda: _field(conn, jobs["failing"], "state") == "failed", 30, message="the failing job failed")
    wait_for(lambda: _field(conn, jobs["retrying"], "state") == "queued" and _field(conn, jobs["retrying"], "attempts")
             == "1", 30, message="the retrying job waiting for its retry")
    for name in ("long-a", "long-b", "long-c"):
        jobs[name] = old.submit(name, items[name], owners[name], f"key-{name}")
    # This release's door is deployed first: an old worker runs (and ends) a job it wrote.
    made = _this_release("submit", "--kind", "prompt", "--template", "{item}", "--owner", owners["from-new"],
                         "--idempotency-key", "key-from-new", "-", stdin="\n".join(items["from-new"]) + "\n")
    assert made.returncode == 0, made.stderr
    jobs["from-new"] = made.stdout.strip()
    wait_for(lambda: _field(conn, jobs["from-new"], "state") == "succeeded", 30, message="an old worker ran from-new")
    # Checked before this release's workers (and their consistency sweep) exist: an old worker
    # ending a job this release wrote leaves none of its keys without an expiry.
    assert _keys_without_expiry(conn, jobs["from-new"]) == []
    for name in ("later-a", "later-b"):
        jobs[name] = old.submit(name, items[name], owners[name], f"key-{name}")
    wait_for(lambda: all(int(_field(conn, jobs[n], "done") or 0) >= 5 for n in ("long-a", "long-b", "long-c")),
             30, message="the long jobs running on the previous release")
    assert {_field(conn, jobs[n], "state") for n in ("later-a", "later-b")} == {"queued"}

    # The deploy: this release's workers join, then the old ones get SIGTERM and hand off.
    for _ in range(2):
        workers.start()
    for proc in old_workers:
        os.killpg(proc.pid, signal.SIGTERM)  # as a platform stops a dyno: the whole process group
    for proc in old_workers:
        _stopped_like_a_platform(proc)

    # Clients retrying across the deploy get the jobs the previous release made.
    for name, job_id in jobs.items():
        again = _this_release("submit", "--kind", "prompt", "--template", "{item}", "--owner", owners[name],
                              "--idempotency-key", f"key-{name}", "--json", "-", stdin="\n".join(items[name]) + "\n")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout) | {"url": None} == {"job_id": job_id, "created": False, "url": None}, name

    ended = {n: j for n, j in jobs.items() if n != "failing"}
    wait_for(lambda: all(_field(conn, j, "state") in ("succeeded", "failed") for j in ended.values()), 90,
             message="every job ended")
    replayed = _this_release("replay", "--yes", "--", jobs["failing"])
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    wait_for(lambda: _field(conn, jobs["failing"], "state") == "succeeded", 30, message="the replayed job succeeded")

    # Every job succeeded with every item, and no item was asked twice.
    calls = _calls_per_prompt(model_server)
    for name, job_id in jobs.items():
        status = states.status(conn, job_id)
        assert status["state"] == "succeeded", (name, status)
        assert status["done"] == status["total"] == len(items[name]), (name, status)
        results = _this_release("results", job_id)
        assert results.returncode == 0, results.stderr
        rows = [json.loads(line) for line in results.stdout.splitlines()]
        assert [(row["item"], row["result"]) for row in rows] == [(item, f"echo: {item}") for item in items[name]]
    asked_twice = {item: n for item, n in calls.items() if n != (2 if item in ("failing-1", "retrying-2") else 1)}
    assert not asked_twice
    assert set(calls) == {item for name in items for item in items[name]}

    # Attempt histories of jobs the previous release ran.
    history = states.status(conn, jobs["retrying"])["history"]
    assert [entry["attempt"] for entry in history] == [1, 2], history
    assert history[0]["ended"].startswith("ModelUnavailable") and "503" in history[0]["ended"], history
    assert history[1]["ended"] == "succeeded", history
    history = states.status(conn, jobs["failing"])["history"]
    assert [(entry["attempt"], entry["ended"].split(":")[0]) for entry in history] == \
        [(1, "PermanentError"), (1, "succeeded")], history
    for name in ("long-a", "long-b", "long-c"):
        history = states.status(conn, jobs[name])["history"]
        assert history and history[-1]["ended"] == "succeeded" and all(e["ended"] for e in history), (name, history)
        assert history[-1]["started_at"] is not None and history[-1]["worker"], (name, history)

    # Nothing kept forever but what is meant to be.
    assert _keys_without_expiry(conn) == []


def test_a_key_this_release_wrote_returns_its_job_through_the_previous_release(previous_bin, conn, tmp_path):
    """A rollback, or a deploy's overlap: a client's repeat reaching the previous release finds
    the job this release made (both forms of the key were written) instead of making a second."""
    old = Previous(previous_bin, tmp_path)
    items = ["one", "two"]
    made = _this_release("submit", "--kind", "prompt", "--template", "{item}", "--owner", "alice",
                         "--idempotency-key", "K", "-", stdin="\n".join(items) + "\n")
    assert made.returncode == 0, made.stderr
    job_id = made.stdout.strip()
    assert old.submit("repeat", items, "alice", "K") == f"{job_id} (existing job for this idempotency key)"
    assert conn.zcard(keys.owner_jobs("alice")) == 1  # no second job
    # And the other way, within the same window: a key the previous release wrote.
    first = old.submit("old first", items, "bob", "K")
    again = _this_release("submit", "--kind", "prompt", "--template", "{item}", "--owner", "bob",
                          "--idempotency-key", "K", "--json", "-", stdin="\n".join(items) + "\n")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["job_id"] == first and json.loads(again.stdout)["created"] is False


# --- what the previous release left, read by this one (no old release needed) ---------------


def _error(attempt: int, at: float, text: str) -> str:
    return json.dumps({"attempt": attempt, "at": at, "error": text})


def _start(attempt: int, at: float, worker: str = "new") -> str:
    return json.dumps({"attempt": attempt, "at": str(at), "worker": worker})


def test_history_of_a_job_the_previous_release_ran_to_its_end():
    """0.2 kept no start entries: attempts come from its errors and, the latest, the job hash."""
    h = {"attempts": "2", "started_at": "200.0", "worker": "old-w"}
    history = details.history([_error(1, 150.0, "ModelUnavailable: 503")], [], "succeeded", None, 260.0, h)
    assert [(e["attempt"], e["worker"], e["ended"]) for e in history] == \
        [(1, None, "ModelUnavailable: 503"), (2, "old-w", "succeeded")]
    assert history[1]["started_at"] == clock.iso(200.0) and history[1]["ended_at"] == clock.iso(260.0)


def test_history_of_a_job_failed_under_the_previous_release_then_replayed():
    """A replay numbers attempts from 1 again: the old error is not this attempt's."""
    h = {"attempts": "1", "started_at": "300.0", "worker": "new"}
    history = details.history([_error(1, 100.0, "PermanentError: 400")], [_start(1, 300.0)], "succeeded", None,
                              320.0, h)
    assert [(e["attempt"], e["ended"]) for e in history] == [(1, "PermanentError: 400"), (1, "succeeded")]


def test_history_of_a_job_the_previous_release_is_running_or_failed():
    running = details.history([], [], "running", None, None, {"attempts": "1", "started_at": "10.0", "worker": "w"})
    assert [(e["attempt"], e["ended"], e["worker"]) for e in running] == [(1, "running", "w")]
    h = {"attempts": "1", "started_at": "10.0", "worker": "w"}
    failed = details.history([_error(1, 20.0, "PermanentError: no")], [], "failed", "PermanentError: no", 20.0, h)
    assert [(e["attempt"], e["ended"]) for e in failed] == [(1, "PermanentError: no")]


def test_history_of_this_releases_jobs_is_unchanged():
    h = {"attempts": "1", "started_at": "50.0"}
    starts = [_start(1, 10.0), json.dumps({"attempt": 1, "at": "20.0", "ended": "handed off"}), _start(1, 50.0)]
    history = details.history([], starts, "succeeded", None, 60.0, h)
    assert [(e["attempt"], e["ended"]) for e in history] == [(1, "handed off"), (1, "succeeded")]
    canceled_while_queued = details.history([_error(1, 30.0, "Boom")], [_start(1, 10.0)], "failed", "canceled",
                                            40.0, {"attempts": "1", "started_at": "10.0"})
    assert [(e["attempt"], e["ended"]) for e in canceled_while_queued] == [(1, "Boom")]


def _ended_by_previous_release(conn, owner: str) -> str:
    """A job the previous release ended: succeeded with an expiry, no index moved."""
    job_id, _ = enqueue(conn, "prompt", {"items": ["x"], "template": "{item}"}, owner=owner)
    conn.hset(keys.job(job_id), mapping={"state": "succeeded", "ended_at": 1.0})
    conn.expire(keys.job(job_id), 3600)
    return job_id


def test_an_owners_job_index_expires_once_a_previous_release_worker_ended_its_last_job(conn):
    """Repaired by the sweep (its index said queued): the owner's job list then expires."""
    state_index.backfill_step(conn)  # the marker: indexes complete
    job_id = _ended_by_previous_release(conn, "frank")
    assert conn.ttl(keys.owner_jobs("frank")) == -1
    assert state_index.reconcile(conn, [(job_id, "frank", "succeeded")]) == 1
    assert conn.ttl(keys.owner_jobs("frank")) > 0


def test_owner_indexes_of_jobs_ended_before_the_backfill_expire_when_it_is_done(conn):
    """0.2 left owners' job lists without an expiry; the expiry script leaves them alone until
    every job is indexed, so finishing the backfill gives each the expiry of its jobs."""
    _ended_by_previous_release(conn, "olive")
    _ended_by_previous_release(conn, "team:ops")
    for owner in ("olive", "team:ops"):
        for state in keys.INDEXED_STATES:
            conn.delete(keys.owner_state(owner, state))
    conn.delete(keys.STATE_INDEX_READY)
    assert state_index.backfill_step(conn)
    assert conn.ttl(keys.owner_jobs("olive")) > 0 and conn.ttl(keys.owner_jobs("team:ops")) > 0
