"""Item errors are an outcome of their own: a job some of whose items ended in an error reads
"succeeded with N of M item errors" on every surface (status JSON, `leash status`, the job page,
My jobs and its filter, `leash jobs`, `leash watch`'s exit code 4, /metrics); a job whose every
item errored, or more than its ``max_item_errors`` (a count or a share, per job or
LEASH_MAX_ITEM_ERRORS), is failed with an error naming the count and the most common item error."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import exit_codes, main
from jobs.core import states
from jobs.enqueue import enqueue
from jobs.errors import InvalidJob
from tests.test_items_workers import ended
from tests.test_web_metrics import samples
from tests.web_support import HTML, create_app_with, csrf_from

OWNER = "shared"  # the owner of an open API and of the CLI without LEASH_API_TOKENS


@pytest.fixture
def kinds_env(env):
    env.setenv("LEASH_IMPORTS", "tests.kinds_for_tests")
    from jobs.kinds import import_kinds

    import_kinds(["tests.kinds_for_tests"])
    return env


def run(conn, burst, items, **payload) -> dict:
    job_id, _ = enqueue(conn, "answers", {"items": items, **payload}, owner=OWNER)
    burst()
    return ended(conn, job_id)


def cli(*args):
    return CliRunner().invoke(main, list(args))


def test_a_job_with_some_item_errors_says_so_on_every_surface(conn, burst, kinds_env):
    final = run(conn, burst, ["one", "bad two", "three", "bad four"])
    job_id = final["job_id"]
    assert (final["state"], final["outcome"], final["item_errors"], final["total"]) == \
        ("succeeded", "succeeded_with_item_errors", 2, 4)

    status = cli("status", job_id)
    assert "succeeded with 2 of 4 item errors" in status.output, status.output
    assert json.loads(cli("status", job_id, "--json").output)["outcome"] == "succeeded_with_item_errors"
    watched = cli("watch", job_id)
    assert watched.exit_code == exit_codes.ITEM_ERRORS == 4, watched.output
    listed = cli("jobs", "--owner", OWNER)
    assert "succeeded with 2 of 4 item errors" in listed.output
    assert job_id in cli("jobs", "--owner", OWNER, "--state", "succeeded_with_item_errors").output
    assert job_id not in cli("jobs", "--owner", OWNER, "--state", "succeeded").output

    client = create_app_with().test_client()
    page = client.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert 'class="state state-succeeded_with_item_errors">succeeded with 2 of 4 item errors' in page
    assert 'id="item-errors-note"' in page
    mine = client.get("/jobs?state=succeeded_with_item_errors", headers=HTML).data.decode()
    assert job_id[:10] in mine and "state-succeeded_with_item_errors" in mine
    assert 'id="filter-succeeded_with_item_errors"' in mine and "with item errors <span class=\"count\">1" in mine
    assert job_id[:10] not in client.get("/jobs?state=succeeded", headers=HTML).data.decode()
    found = samples(client.get("/metrics"))
    assert found[("leash_jobs_succeeded_with_item_errors_total", (("kind", "answers"),))] == 1
    assert ("leash_jobs_succeeded_total", (("kind", "answers"),)) not in found


def test_a_job_whose_every_item_errored_fails_naming_the_count_and_the_most_common_error(conn, burst, kinds_env):
    final = run(conn, burst, ["bad one", "bad two", "bad one"])
    assert final["state"] == "failed" and final["outcome"] == "failed" and final["item_errors"] == 3
    assert final["error"] == "3 of 3 items ended in an error; the most common (3): cannot answer 'bad'", final["error"]
    watched = cli("watch", final["job_id"])
    assert watched.exit_code == exit_codes.FAILED and "3 of 3 items ended in an error" in watched.output


@pytest.mark.parametrize(("limit", "words"), [(1, "max_item_errors 1"), ("25%", "max_item_errors 25%"),
                                              (0.25, "max_item_errors 0.25")])
def test_more_item_errors_than_the_job_allows_fail_it(conn, burst, kinds_env, limit, words):
    final = run(conn, burst, ["one", "bad two", "three", "bad four"], max_item_errors=limit)
    assert final["state"] == "failed" and final["item_errors"] == 2
    assert final["error"] == f"2 of 4 items ended in an error, more than {words} allows; " \
                             "the most common (2): cannot answer 'bad'", final["error"]


def test_the_deployment_wide_limit_applies_and_a_job_of_its_own_wins(conn, burst, kinds_env):
    kinds_env.setenv("LEASH_MAX_ITEM_ERRORS", "1")
    strict = run(conn, burst, ["one", "bad two", "bad three"])
    assert strict["state"] == "failed" and "more than LEASH_MAX_ITEM_ERRORS 1 allows" in strict["error"]
    lenient = run(conn, burst, ["one", "bad two", "bad three"], max_item_errors="90%")
    assert lenient["outcome"] == "succeeded_with_item_errors" and lenient["item_errors"] == 2


def test_a_job_without_item_errors_is_plainly_succeeded(conn, burst, kinds_env):
    final = run(conn, burst, ["one", "two"])
    assert (final["outcome"], final["item_errors"]) == ("succeeded", 0)
    assert cli("watch", final["job_id"]).exit_code == 0


@pytest.mark.parametrize("bad", [-1, "lots", "150%", True, 1.5])
def test_a_bad_max_item_errors_is_refused_at_the_door(conn, kinds_env, bad):
    with pytest.raises(InvalidJob, match="max_item_errors"):
        enqueue(conn, "classify", {"items": ["a"], "labels": ["x", "y"], "max_item_errors": bad})


def test_queued_and_running_jobs_have_no_outcome_yet(conn, kinds_env):
    job_id, _ = enqueue(conn, "answers", {"items": ["bad one"]}, owner=OWNER)
    fields = states.status(conn, job_id)
    assert fields["outcome"] is None and fields["item_errors"] == 0


def test_the_outcome_texts_are_the_ones_leash_and_rq_store():
    from jobs.core import outcome
    from jobs.core.rq_side import ENDED_BY_RQ
    from jobs.errors import CANCELED

    assert outcome.CANCELED == CANCELED and outcome.STOPPED_BY_RQ == ENDED_BY_RQ["stopped"]
    assert ENDED_BY_RQ["canceled"].startswith(outcome.CANCELED_IN_RQ)


def test_retrying_the_errored_items_asks_only_those_again(conn, burst, kinds_env):
    from tests.kinds_for_tests import item_calls
    from tests.test_items_workers import stored

    final = run(conn, burst, ["one", "bad two", "three", "bad four"])
    job_id = final["job_id"]
    page = create_app_with().test_client().get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert 'id="retry-errored-button"' in page and "Retry the 2 errored items" in page
    assert "would ask 2 errored items" in cli("replay", "--errored-items", "--dry-run", job_id).output
    conn.set("test:answers:fixed", 1)  # the model answers them now
    out = cli("replay", "--errored-items", job_id)
    assert out.exit_code == 0 and "replayed 1 job" in out.output, out.output
    burst()
    again = ended(conn, job_id)
    assert (again["outcome"], again["item_errors"], again["done"]) == ("succeeded", 0, 4), again["error"]
    assert item_calls(conn, job_id) == {0: 1, 1: 2, 2: 1, 3: 2}  # the answered items were not asked again
    assert stored(conn, job_id) == {0: "ONE", 1: "BAD TWO", 2: "THREE", 3: "BAD FOUR"}
    nothing = cli("replay", "--errored-items", job_id)
    assert nothing.exit_code == 1 and "no item of it ended in an error" in nothing.output


def test_a_job_failed_by_its_item_errors_retries_them_through_the_api(conn, burst, kinds_env):
    final = run(conn, burst, ["bad one", "bad two"])
    assert final["state"] == "failed"
    conn.set("test:answers:fixed", 1)
    response = create_app_with().test_client().post(f"/jobs/{final['job_id']}/replay", json={"errored_items": True})
    assert response.status_code == 202, response.get_json()
    burst()
    again = ended(conn, final["job_id"])
    assert again["outcome"] == "succeeded" and again["done"] == 2


def test_at_the_owners_queued_cap_retrying_errored_items_leaves_the_job_exactly_as_it_was(conn, burst, kinds_env):
    from tests.test_items_workers import stored

    final = run(conn, burst, ["one", "bad two", "three", "bad four"])
    failed = run(conn, burst, ["bad one", "bad two"])
    job_id = final["job_id"]
    before = {job: (states.status(conn, job), stored(conn, job)) for job in (job_id, failed["job_id"])}
    kinds_env.setenv("LEASH_MAX_QUEUED_PER_OWNER", "1")
    enqueue(conn, "answers", {"items": ["waiting"]}, owner=OWNER)  # the owner's one queued place is taken
    for job in (job_id, failed["job_id"]):
        refused = cli("replay", "--errored-items", job)
        assert refused.exit_code == exit_codes.FAILED and "left as it was" in refused.output, refused.output
        assert "LEASH_MAX_QUEUED_PER_OWNER" in refused.output
        now = states.status(conn, job)
        then, items = before[job]
        assert stored(conn, job) == items  # its errored items are still there
        for field in ("state", "outcome", "item_errors", "done", "error", "result"):
            assert now[field] == then[field], (job, field, now[field], then[field])
        assert "reopened" not in json.dumps(now)
    page = create_app_with().test_client().post(f"/jobs/{job_id}/replay", json={"errored_items": True})
    assert page.status_code == 429 and "left as it was" in page.get_json()["error"]
    assert states.status(conn, job_id)["outcome"] == "succeeded_with_item_errors"
    # With room again, the job goes from succeeded straight to queued, its errored items dropped.
    kinds_env.setenv("LEASH_MAX_QUEUED_PER_OWNER", "10")
    assert cli("replay", "--errored-items", job_id).exit_code == 0
    now = states.status(conn, job_id)
    assert (now["state"], now["done"], now["result"], now["error"]) == ("queued", 2, None, None)
    assert sorted(stored(conn, job_id)) == [0, 2]


def test_a_plain_replay_of_a_job_failed_by_its_item_errors_asks_exactly_those_again(conn, burst, model_server):
    from tests.fake_openai import Reply
    from tests.test_items_workers import calls_per_item, stored

    items = ["kettle -> negative", "lid -> negative", "cord -> positive", "fan -> positive"]
    for item in items[:2]:
        model_server.on(item, Reply("banana"), times=2)  # off-label, and again when corrected: an item error
    job_id, _ = enqueue(conn, "classify", {"items": items, "labels": ["positive", "negative"], "max_item_errors": 1})
    burst()
    final = ended(conn, job_id)
    assert final["state"] == "failed" and final["item_errors"] == 2, final
    assert final["error"].startswith("2 of 4 items ended in an error, more than max_item_errors 1 allows")
    assert calls_per_item(model_server) == {items[0]: 2, items[1]: 2, items[2]: 1, items[3]: 1}

    dry = cli("replay", "--dry-run", job_id)
    assert "it failed by its item errors: would ask its 2 errored items again" in dry.output, dry.output
    out = cli("replay", job_id)  # plain: no --errored-items
    print(out.output)
    assert out.exit_code == 0 and "replayed 1 job" in out.output, out.output
    assert "it failed by its item errors: asks its 2 errored items again; its answered items stay" in out.output
    assert sorted(stored(conn, job_id)) == [2, 3]  # the errored ones left in the same step
    burst()
    again = ended(conn, job_id)
    print({k: again[k] for k in ("state", "outcome", "item_errors", "done", "error")}, calls_per_item(model_server))
    assert (again["state"], again["outcome"], again["item_errors"], again["done"]) == ("succeeded", "succeeded", 0, 4)
    # The stand-in was asked once more for each errored item, never again for the answered ones.
    assert calls_per_item(model_server) == {items[0]: 3, items[1]: 3, items[2]: 1, items[3]: 1}
    assert stored(conn, job_id) == {0: "negative", 1: "negative", 2: "positive", 3: "positive"}
    from jobs import deadletter

    assert deadletter.audit_log(conn, 1)[0]["selector"]["errored_items_asked"] == 2


def test_the_replay_button_of_a_job_failed_by_its_item_errors_says_and_does_it(conn, burst, kinds_env):
    from tests.kinds_for_tests import item_calls

    final = run(conn, burst, ["bad one", "two", "bad three"], max_item_errors=1)
    job_id = final["job_id"]
    assert final["state"] == "failed"
    client = create_app_with().test_client()
    page = client.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert 'id="replay-button"' in page and 'id="replay-asks-errored"' in page
    assert "a replay asks its 2 errored items again" in page
    assert 'id="retry-errored-button"' not in page  # the Replay button does it: one button, not two
    confirm = client.post(f"/jobs/{job_id}/replay", headers=HTML, data={"csrf_token": csrf_from(page.encode())})
    assert "too many of its items ended in an error: those items are asked again" in confirm.data.decode()
    conn.set("test:answers:fixed", 1)
    response = create_app_with().test_client().post(f"/jobs/{job_id}/replay", json={})  # the API's plain replay
    print(response.get_json())
    assert response.status_code == 202 and response.get_json()["errored_items_asked"] == 2, response.get_json()
    burst()
    again = ended(conn, job_id)
    assert (again["outcome"], again["done"]) == ("succeeded", 3), again["error"]
    assert item_calls(conn, job_id) == {0: 2, 1: 1, 2: 2}


def test_a_job_failed_for_another_reason_replays_with_its_stored_item_errors_kept(conn, burst, kinds_env):
    from jobs import keys
    from tests.kinds_for_tests import item_calls
    from tests.test_items_workers import stored

    final = run(conn, burst, ["bad one", "two", "three"], max_item_errors=0)
    job_id = final["job_id"]
    assert final["state"] == "failed" and final["item_errors"] == 1
    # As a job that stopped at its budget after an item errored: its error is not its item errors.
    conn.hset(keys.job(job_id), "error", "budget reached: 100 of 100 tokens")
    before = stored(conn, job_id)
    dry = cli("replay", "--dry-run", "--json", job_id)
    assert "errored_items_asked" not in json.loads(dry.output)["would_replay"][0], dry.output
    out = cli("replay", job_id)
    assert out.exit_code == 0 and "replayed 1 job" in out.output and "item errors" not in out.output, out.output
    assert stored(conn, job_id) == before  # nothing dropped: replayed as it was
    burst()
    assert item_calls(conn, job_id) == {0: 1, 1: 1, 2: 1}  # no item asked again
    assert ended(conn, job_id)["state"] == "failed"  # its kept item error is over the limit still


def test_the_failure_text_is_the_one_a_replay_recognises():
    from collections import Counter

    from jobs.core import outcome

    errors = Counter({"cannot answer 'bad'": 2})
    assert outcome.failed_by_item_errors(outcome.failure_text(errors, 4, "max_item_errors 1"))
    assert outcome.failed_by_item_errors(outcome.failure_text(errors, 2, "max_item_errors 1"))  # every item
    assert not outcome.failed_by_item_errors("ValueError: 2 of 4 items ended in an error")
    assert not outcome.failed_by_item_errors(None)
