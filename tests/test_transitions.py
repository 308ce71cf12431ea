"""Every state-changing script runs from jobs/lifecycle/transitions.py, with its keys passed by
name and checked against the one KEYS line each script declares."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from jobs import keys
from jobs.lifecycle import scripts, transitions

ROOT = Path(__file__).resolve().parents[1]

#: The scripts that change a job (see transitions' docstring), by name without their version.
TRANSITIONS = {"archived", "batch_note", "cancel", "claim", "end_outside", "fail", "finish", "heartbeat", "index_job",
               "owner_index_expiry", "park", "reclaim", "release", "replay", "requeue_swallowed", "restore_record",
               "retain", "reservations_settle", "store_items", "usage_record", "webhook"}
#: The scripts that change no job, run from their own modules.
OTHERS = {"cache_retire", "cache_sweep", "compact_finished_rq_job", "door_take", "failure_heads", "model_admit",
          "model_concurrency", "model_rate", "release_stale_lock", "reservations_sweep",
          "session_start"}


def family(name: str) -> str:
    return re.sub(r"_v\d+$", "", name)


def declaring() -> list[str]:
    return scripts.names()


def code(text: str) -> str:
    """Lua without its comments."""
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def used_keys(body: str, declared: int) -> set[int]:
    """The KEYS indexes ``body`` uses, of the ``declared`` fixed ones. The shared helpers in
    _lib.lua take their keys as arguments (tests/test_lua_files.py checks they read no KEYS), so
    a script's own text names every key it touches: ``KEYS[i]``, or ``tail(KEYS, i)`` for
    KEYS[i] onwards."""
    used = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", body)}
    for first in re.findall(r"tail\(KEYS,\s*(\d+)\)", body):
        used |= set(range(int(first), max(declared, int(first)) + 1))
    return used


def test_every_script_declares_its_keys_once_on_its_first_line():
    assert len(declaring()) > 20
    for name in declaring():
        lines = (scripts.LUA_DIR / f"{name}.lua").read_text().splitlines()
        assert lines[0].startswith("-- KEYS: "), f"{name}: line 1 is not its KEYS line"
        assert sum(line.startswith("-- KEYS:") for line in lines) == 1, f"{name}: more than one KEYS line"
        declared = scripts.declared_keys(name)
        assert all(re.fullmatch(r"[a-z][a-z0-9_]*", key.removesuffix("...")) for key in declared), name


def test_the_declared_keys_are_the_keys_each_script_uses():
    for name in declaring():
        declared = scripts.declared_keys(name)
        variadic = declared[-1].endswith("...")
        fixed = len(declared) - variadic
        used = used_keys(code((scripts.LUA_DIR / f"{name}.lua").read_text()), fixed)
        assert max(used) == fixed, f"{name}: declares {fixed} keys, uses KEYS[{max(used)}]"
        if not variadic:
            assert used == set(range(1, fixed + 1)), f"{name}: declared but unused: {set(range(1, fixed + 1)) - used}"


def test_the_check_sees_a_declared_key_the_script_does_not_use():
    assert used_keys("redis.call('GET', KEYS[1])\nredis.call('GET', KEYS[3])", 3) == {1, 3}
    assert used_keys("f(KEYS[1], tail(KEYS, 3))", 4) == {1, 3, 4}


class Unreachable:
    """A connection that fails the test if anything is sent or registered."""

    def __getattr__(self, name):
        raise AssertionError(f"Redis was called ({name}) before the keys were checked")


CLAIM_KEYS = {"job": "j", "leases": "l", "history": "h", "queued": "q", "running": "r", "succeeded": "s",
              "failed": "f", "expiries": "e"}


def test_run_refuses_a_missing_key_naming_the_script_and_the_key():
    given = {k: v for k, v in CLAIM_KEYS.items() if k != "leases"}
    with pytest.raises(TypeError, match=r"^claim_v4: missing key 'leases'$"):
        scripts.run(Unreachable(), "claim_v4", given, [])


def test_run_refuses_an_extra_key_naming_the_script_and_the_key():
    with pytest.raises(TypeError, match=r"^claim_v4: unexpected key 'lease'$"):
        scripts.run(Unreachable(), "claim_v4", {**CLAIM_KEYS, "lease": "x"}, [])


def test_run_refuses_keys_given_by_position():
    with pytest.raises(TypeError, match=r"^claim_v4: keys are passed by name"):
        scripts.run(Unreachable(), "claim_v4", list(CLAIM_KEYS.values()), [])


def test_run_refuses_a_variadic_key_given_one_name_and_a_key_given_a_list():
    given = {"job": "j", "retained": "one-key"}
    with pytest.raises(TypeError, match=r"^retain_v1: key 'retained' takes a list"):
        scripts.run(Unreachable(), "retain_v1", given, [])
    with pytest.raises(TypeError, match=r"^retain_v1: key 'job' takes one key name"):
        scripts.run(Unreachable(), "retain_v1", {"job": ["j"], "retained": []}, [])


def test_run_refuses_a_script_without_a_keys_line(monkeypatch):
    monkeypatch.setitem(scripts._FILES, "undeclared_v1", "-- does something\nreturn 1\n")
    with pytest.raises(ValueError, match=r"^undeclared_v1: its first line declares no keys"):
        scripts.run(Unreachable(), "undeclared_v1", {}, [])


def test_run_orders_the_keys_by_the_declaration_whatever_order_they_come_in():
    backwards = dict(reversed(list(CLAIM_KEYS.items())))
    assert scripts.ordered_keys("claim_v4", backwards) == list(CLAIM_KEYS.values())
    assert scripts.ordered_keys("failure_heads_v1", {"jobs": ["a", "b"], "failed_index": "f"}) == ["f", "a", "b"]


def test_every_script_is_a_transition_or_one_of_the_others():
    assert {family(name) for name in declaring()} == TRANSITIONS | OTHERS


def test_no_module_outside_jobs_lifecycle_runs_a_state_changing_script():
    families = "|".join(sorted(TRANSITIONS, key=len, reverse=True))
    named = re.compile(rf"""["']((?:{families})_v\d+)["']""")
    offenders = [f"{path.relative_to(ROOT)}: {match}" for folder in ("jobs", "web", "cli")
                 for path in sorted((ROOT / folder).rglob("*.py")) if "lifecycle" not in path.parts
                 for match in named.findall(path.read_text())]
    assert offenders == []
    run_here = set(named.findall((ROOT / "jobs" / "lifecycle" / "transitions.py").read_text()))
    assert {family(name) for name in run_here} == TRANSITIONS


class Recorder:
    """Stands in for ``scripts.script``: records each script run and the KEYS it was sent."""

    def __init__(self):
        self.runs: list[tuple[str, list[str]]] = []

    def __call__(self, connection, name):
        def send(keys, args, client=None):
            self.runs.append((name, list(keys)))
            return None
        return send


def test_each_transition_sends_the_keys_its_callers_sent_before(conn, monkeypatch):
    """Each function, called with a stand-in for Redis's script call: the script it runs and the
    KEYS in order, as the call sites built them by position."""
    recorder = Recorder()
    monkeypatch.setattr(scripts, "script", recorder)
    job, owner, queue, kind, now = "j1", "ann", "leash", "classify", 1000.0
    indexes = keys.owner_state_indexes(owner)
    usage = {"usage": "u", "owner_day": "d", "model_usage": "m", "reservations": "r", "reservation_records": "rr"}
    cache = {"cache_index": "ci", "cache_sizes": "cs", "cache_bytes": "cb", "cache_entries": ["e1", "e2"]}
    item_keys = transitions.item_keys(conn, job, queue)
    item = [keys.job(job), keys.LEASES, keys.items(job), keys.rq_job(job), keys.rq_started(queue, conn),
            keys.REJECTED_WRITES]
    common = [keys.job(job), keys.LEASES]
    rq_side = [keys.rq_job(job), keys.rq_queue(queue), keys.rq_started(queue, conn), keys.rq_executions(job, conn)]
    calls = {
        "claim": (lambda: transitions.claim(conn, job, owner, []),
                  "claim_v4", [keys.job(job), keys.LEASES, keys.history(job)] + indexes),
        "heartbeat": (lambda: transitions.heartbeat(conn, item_keys, usage, cache, []),
                      "heartbeat_v4", item + ["u", "d", "m", "r", "rr", "ci", "cs", "cb", "e1", "e2"]),
        "store_items": (lambda: transitions.store_items(conn, item_keys, usage, cache, []),
                        "store_items_v2", item + ["u", "d", "m", "r", "rr", "ci", "cs", "cb", "e1", "e2"]),
        "usage_record": (lambda: transitions.usage_record(conn, job, usage, []),
                         "usage_record_v3", [keys.job(job), "u", "d", "m", "r", "rr", keys.received_answers(job)]),
        "batch_usage_record": (lambda: transitions.batch_usage_record(conn, job, owner, "2026-01-01", "m1", []),
                               "usage_record_v3", [keys.job(job), keys.usage(job),
                                                   keys.usage_owner_day(owner, "2026-01-01"), keys.usage_model("m1"),
                                                   keys.owner_reservations(owner),
                                                   keys.owner_reservation_records(owner),
                                                   keys.received_answers(job)]),
        "settle_abandoned": (lambda: transitions.settle_abandoned(conn, job, owner, []),
                             "reservations_settle_v1", [keys.job(job), keys.owner_reservations(owner),
                                                        keys.owner_reservation_records(owner)]),
        "finish": (lambda: transitions.finish(conn, job, owner, kind, now, []),
                   "finish_v3", common + [keys.items(job), keys.errors(job), keys.REJECTED_WRITES]
                   + keys.outcome_keys("succeeded", kind, now) + [keys.payload(job)] + indexes),
        "fail": (lambda: transitions.fail(conn, job, owner, "canceled", kind, now, []),
                 "fail_v2", common + [keys.items(job), keys.errors(job), keys.REJECTED_WRITES]
                 + keys.outcome_keys("canceled", kind, now) + [keys.FAILED_INDEX, keys.payload(job)] + indexes),
        "release": (lambda: transitions.release(conn, job, owner, queue, []),
                    "release_v3", common + rq_side + [keys.REJECTED_WRITES, keys.history(job)] + indexes),
        "park": (lambda: transitions.park(conn, job, []),
                 "park_v1", [keys.job(job), keys.LEASES, keys.REJECTED_WRITES, keys.BATCH_LOOKS]),
        "batch_note": (lambda: transitions.batch_note(conn, job, keys.provider_batches(job), []),
                       "batch_note_v1", [keys.job(job), keys.provider_batches(job), keys.REJECTED_WRITES]),
        "reclaim": (lambda: transitions.reclaim(conn, job, owner, queue, kind, now, []),
                    "reclaim_v2", [keys.job(job), keys.LEASES, keys.errors(job)] + rq_side
                    + [keys.rq_failed(queue, conn), keys.RECLAIMS, keys.items(job)]
                    + keys.outcome_keys("failed", kind, now) + [keys.FAILED_INDEX, keys.payload(job)] + indexes),
        "cancel": (lambda: transitions.cancel(conn, job, owner, "2026-01-01", kind, now, []),
                   "cancel_v3", [keys.job(job), keys.CANCELS, keys.items(job), keys.errors(job)]
                   + keys.outcome_keys("canceled", kind, now) + [keys.FAILED_INDEX, keys.payload(job)] + indexes
                   + [keys.LEASES, keys.usage_owner_day(owner, "2026-01-01"), keys.owner_reservations(owner),
                      keys.owner_reservation_records(owner)]),
        "end_outside": (lambda: transitions.end_outside(conn, job, owner, "failed", kind, now, []),
                        "end_outside_v2", [keys.job(job), keys.errors(job), keys.items(job), keys.payload(job),
                                           keys.FAILED_INDEX, keys.ACTIVE] + keys.outcome_keys("failed", kind, now)
                        + indexes),
        "replay": (lambda: transitions.replay(conn, ["a", "b"], []),
                   "replay_v4", [keys.FAILED_INDEX, keys.ACTIVE, "a", "b"]),
        "requeue_swallowed": (lambda: transitions.requeue_swallowed(conn, job, queue, []),
                              "requeue_swallowed_v2", [keys.job(job), keys.rq_job(job),
                                                       keys.rq_intermediate(queue, conn), keys.rq_queue(queue)]),
        "index_job": (lambda: transitions.index_job(conn, job, owner, []), "index_job_v1", [keys.job(job)] + indexes),
        "owner_index_expiry": (lambda: transitions.owner_index_expiry(conn, owner, []),
                               "owner_index_expiry_v1", [keys.owner_jobs(owner), *indexes, keys.STATE_INDEX_READY]),
        "archived": (lambda: transitions.archived(conn, job, []),
                     "archived_v1", [keys.job(job), *keys.archived_heavy(job, conn)]),
        "webhook": (lambda: transitions.webhook(conn, job, []), "webhook_v1", [keys.job(job)]),
        "restore_record": (lambda: transitions.restore_record(conn, job, owner, []),
                           "restore_record_v1", [keys.job(job), keys.errors(job), keys.history(job),
                                                 keys.estimate(job), keys.FAILED_INDEX, keys.owner_jobs(owner)]
                           + indexes),
        "retain": (lambda: transitions.retain(conn, job, []),
                   "retain_v1", [keys.job(job), *keys.retained_with_job(job, conn)]),
    }
    functions = {name for name, f in inspect.getmembers(transitions, inspect.isfunction)
                 if f.__module__ == transitions.__name__ and not name.startswith("_")}
    assert functions - {"item_keys"} == set(calls), "a transition this test does not call"
    for name, (call, script, expected) in calls.items():
        recorder.runs.clear()
        call()
        assert recorder.runs == [(script, expected)], name
