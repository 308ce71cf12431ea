"""A job's address answers from the archive once Redis no longer holds its record: Redis emptied
(FLUSHDB: a restart without persistence, a failover to an empty replica) after real jobs ended
and were archived, every surface reads the same as before — the page, the status JSON, the
results pages and downloads, `leash status` and `leash results` — marked as read from the
archive; another owner still gets the 404 an unknown id gets; cancel and look now answer 409;
a replay puts the record back and runs, and its dry run, writing nothing, says what it would do
as for a job Redis holds; an archive that does not answer is a 503, never a 404; a
webhook delivered after the job was archived reads as delivered. Against SQLite and a real
PostgreSQL."""

from __future__ import annotations

import json
import re
from contextlib import contextmanager

import pytest
from click.testing import CliRunner
from sqlalchemy import event

from cli import exit_codes, main
from jobs import keys
from jobs.archive import database, restore, sweep
from jobs.config import settings
from jobs.core import control
from jobs.enqueue import enqueue
from jobs.read import job_status, listing
from jobs.webhooks import delivery, outbox
from tests.conftest import run_burst
from tests.kinds_for_tests import item_calls
from tests.test_extract import SCHEMA
from tests.test_webhooks import SECRET
from tests.web_support import CLASSIFY, HTML, bearer, sign_in

pytestmark = pytest.mark.slow

OWNER = "alice"


@pytest.fixture(autouse=True)
def sweeps_by_hand(monkeypatch):
    """The in-process workers archive nothing themselves: each test sweeps when it means to."""
    monkeypatch.setattr(sweep, "tick", lambda connection: 0)


@pytest.fixture
def hooks(env):
    env.setenv("LEASH_WEBHOOK_SECRET", SECRET)
    env.setenv("LEASH_WEBHOOK_ALLOW_PRIVATE", "1")
    env.setenv("LEASH_WEBHOOK_BACKOFF", ",".join(["0"] * 7))  # seven retries at once
    return env


def ended_jobs(conn) -> dict[str, str]:
    """Five real jobs, run to their ends by a worker: succeeded with item errors, failed (its
    first two items stored), canceled, an extract job (its results in columns) and a reduce (one
    result, its instruction as its item)."""
    conn.set("test:broken:lost", 1)  # breaks_at fails at item 2 while this key exists
    jobs = {
        "item_errors": enqueue(conn, "answers", {"items": ["one", "bad two", "three", "bad four"]},
                               owner=OWNER, name="some answers")[0],
        "failed": enqueue(conn, "breaks_at", {"items": ["a", "b", "c", "d"], "break_at": 2, "flag": "lost"},
                          owner=OWNER, max_attempts=1)[0],
        "canceled": enqueue(conn, "count", {"items": ["x", "y"], "delay": 0}, owner=OWNER)[0],
        "extract": enqueue(conn, "extract", {"items": [f"review {n} of gadget{n}" for n in range(3)],
                                             "schema": SCHEMA}, owner=OWNER)[0],
        "reduce": enqueue(conn, "reduce", {"items": ["the kettle leaks", "the lid is loose"],
                                           "instruction": "Summarise the complaints"}, owner=OWNER)[0],
    }
    control.cancel(conn, jobs["canceled"])
    run_burst()
    return jobs


def cli(*args) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


#: What changes between two renderings of the same page or status text whatever was read: how long
#: ago each time was ("5 s ago"), and the CSRF token each page is given.
_AGO = re.compile(r'<span class="ago">\([^)]*\)</span>|\((just now|[^()]* ago|in [^()]*)\)')
_CSRF = re.compile(r'name="csrf_token" (type="hidden" )?value="[^"]+"')
_NOTE = re.compile(r'<p id="from-archive" class="meta">[^<]*</p>')


def steady(text: str) -> str:
    """``text`` without what changes between two renderings, nor its lines of only spaces."""
    lines = _CSRF.sub("csrf", _AGO.sub("", text)).splitlines()
    return "\n".join(line for line in lines if line.strip())


def surfaces(client, job_id: str) -> dict:
    """Everything the job's address and the command line answer of it."""
    headers = bearer(OWNER)
    status = client.get(f"/jobs/{job_id}", headers=headers)
    assert status.status_code == 200, status.data
    seen = {
        "status": status.get_json(),
        "page": steady(client.get(f"/jobs/{job_id}", headers=HTML).data.decode()),
        "results": client.get(f"/jobs/{job_id}/result", headers=headers).get_json(),
        "results_page": client.get(f"/jobs/{job_id}/result?offset=1&limit=2", headers=headers).get_json(),
        "csv": client.get(f"/jobs/{job_id}/result.csv", headers=headers).data,
        "jsonl": client.get(f"/jobs/{job_id}/result.jsonl", headers=headers).data,
        "cli_status_json": json.loads(cli("status", job_id, "--json")[1]),
        "cli_status": (lambda done: (done[0], steady(done[1])))(cli("status", job_id)),
        "cli_watch": cli("watch", job_id, "--json"),
        "cli_results": cli("results", job_id),
        "cli_csv": cli("results", job_id, "--format", "csv"),
    }
    assert seen["page"].count('id="job-id"') == 1
    return seen


@contextmanager
def sql_statements():
    """The statements sent to the archive meanwhile (a list, filled as they are sent)."""
    sent: list[str] = []
    engine = database.engine()

    def note(_conn, _cursor, statement, *_args) -> None:
        sent.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", note)


def lose_redis(conn) -> None:
    """Redis loses everything (a restart without persistence, a failover to an empty replica)."""
    conn.flushdb()
    assert conn.dbsize() == 0


def test_every_surface_reads_the_same_from_the_archive_once_redis_lost_the_jobs(
        conn, model_server, archive_url, token_app):
    jobs = ended_jobs(conn)
    client = token_app.test_client()
    assert sign_in(client, OWNER).status_code == 303
    before = {name: surfaces(client, job_id) for name, job_id in jobs.items()}
    outcomes = {name: seen["status"]["outcome"] for name, seen in before.items()}
    assert outcomes == {"item_errors": "succeeded_with_item_errors", "failed": "failed", "canceled": "canceled",
                        "extract": "succeeded", "reduce": "succeeded"}, outcomes
    assert b"Summarise the complaints" in before["reduce"]["csv"]
    assert all(seen["status"]["source"] == "redis" for seen in before.values())
    assert b"product,stars,tags,error" in before["extract"]["csv"]  # a column per property
    assert sweep.sweep(conn) == 5
    with sql_statements() as sent:  # while Redis holds a job's record, its reads never ask the archive
        assert surfaces(client, jobs["extract"])["status"] == before["extract"]["status"]
    assert sent == []

    lose_redis(conn)
    assert sign_in(client, OWNER).status_code == 303  # its session went with Redis
    job_id, headers = jobs["item_errors"], bearer(OWNER)
    for path, queries in ((f"/jobs/{job_id}", 1), (f"/jobs/{job_id}/result", 2)):
        with sql_statements() as sent:  # its row; then the page's rows
            assert client.get(path, headers=headers).status_code == 200
        assert len(sent) == queries, (path, sent)
    with sql_statements() as sent:
        assert client.get(f"/jobs/{job_id}", headers=HTML).status_code == 200
    assert len(sent) == 2, sent  # the page: its row, then the page's inputs and results
    for name, job_id in jobs.items():
        after = surfaces(client, job_id)
        was = before[name]
        print(name, job_id, after["status"]["outcome"], after["status"]["error_summary"], len(after["csv"]), "bytes")
        # The marker is the one difference; nothing else in a status is live once a job has ended.
        assert after["status"] == was["status"] | {"source": "archive"}, name
        assert after["cli_status_json"] == was["cli_status_json"] | {"source": "archive"}, name
        assert after["cli_watch"][0] == was["cli_watch"][0] and \
            json.loads(after["cli_watch"][1]) == json.loads(was["cli_watch"][1]) | {"source": "archive"}, name
        # The page and `leash status` say the same, with one line more saying where it was read.
        assert 'id="from-archive"' in after["page"] and 'id="from-archive"' not in was["page"]
        assert "Redis no longer holds this job" in after["page"]
        assert steady(_NOTE.sub("", after["page"])) == was["page"], name
        code, text = after["cli_status"]
        assert code == was["cli_status"][0], name
        assert text.splitlines()[:-1] == was["cli_status"][1].splitlines(), name
        assert text.splitlines()[-1] == "source       " + job_status.ARCHIVE_NOTE
        for same in ("results", "results_page", "csv", "jsonl", "cli_results", "cli_csv"):
            assert after[same] == was[same], (name, same)


def test_another_owner_gets_what_an_unknown_id_gets_and_without_an_archive_the_404_stays(
        conn, archive_url, token_app, env):
    job_id = enqueue(conn, "answers", {"items": ["one", "bad two"]}, owner=OWNER)[0]
    run_burst()
    assert sweep.sweep(conn) == 1
    lose_redis(conn)
    client = token_app.test_client()
    for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/result", f"/jobs/{job_id}/result.csv",
                 f"/jobs/{job_id}/result.jsonl"):
        mine = client.get(path, headers=bearer(OWNER))
        assert mine.status_code == 200 and (b"bad two" in mine.data or job_id.encode() in mine.data), path
        theirs = client.get(path, headers=bearer("bob"))
        unknown = client.get(path.replace(job_id, "no-such-job-id"), headers=bearer("bob"))
        assert (theirs.status_code, theirs.get_json()) == (unknown.status_code, unknown.get_json()) == \
            (404, {"error": "no such job"}), path
    browser = token_app.test_client()
    assert sign_in(browser, "bob").status_code == 303
    page, unknown = browser.get(f"/jobs/{job_id}", headers=HTML), browser.get("/jobs/no-such-job-id", headers=HTML)
    assert page.status_code == unknown.status_code == 404 and page.data == unknown.data

    env.delenv("LEASH_ARCHIVE_URL")
    env.delenv("DATABASE_URL", raising=False)
    database.forget()
    gone = client.get(f"/jobs/{job_id}", headers=bearer(OWNER))
    assert (gone.status_code, gone.get_json()) == (404, {"error": "no such job"})
    assert client.get(f"/jobs/{job_id}/result.csv", headers=bearer(OWNER)).status_code == 404
    code, text = cli("status", job_id)
    assert code == exit_codes.BAD_INPUT and "no such job" in text, text


def test_cancel_and_look_answer_409_and_a_replay_puts_the_record_back_and_runs(
        conn, model_server, archive_url, token_app):
    jobs = ended_jobs(conn)
    failed = jobs["failed"]
    stored = item_calls(conn, failed)  # items run side by side: those before and after item 2 may be stored
    assert 2 not in stored and {0, 1} <= set(stored)
    assert sweep.sweep(conn) == 5
    lose_redis(conn)  # the bug's key goes too: the replay gets past item 2
    client = token_app.test_client()
    headers = bearer(OWNER)
    for name, job_id in jobs.items():
        canceled = client.post(f"/jobs/{job_id}/cancel", headers=headers)
        assert canceled.status_code == 409 and "only in the archive" in canceled.get_json()["error"], name
        looked = client.post(f"/jobs/{job_id}/look", headers=headers)
        assert looked.status_code == 409 and "only in the archive" in looked.get_json()["error"], name
        code, text = cli("cancel", job_id)
        assert code == exit_codes.FAILED and "only in the archive" in text, text
    print(canceled.get_json()["error"])
    assert conn.dbsize() == 0  # refusing wrote nothing

    replayed = client.post(f"/jobs/{failed}/replay", headers=headers)
    assert replayed.status_code == 202, replayed.get_json()
    assert client.get(f"/jobs/{failed}", headers=headers).get_json()["source"] == "redis"
    run_burst()
    status = client.get(f"/jobs/{failed}", headers=headers).get_json()
    assert (status["state"], status["done"], status["source"]) == ("succeeded", 4, "redis"), status
    # Its stored items came back from the archive: not asked again (the counts went with Redis).
    assert item_calls(conn, failed) == {index: 1 for index in range(4) if index not in stored}
    rows = [json.loads(line)["result"] for line in client.get(f"/jobs/{failed}/result.jsonl", headers=headers).data
            .decode().splitlines()]
    assert rows == ["A", "B", "C", "D"]
    listed = client.get("/jobs", headers=headers).get_json()
    assert [job["job_id"] for job in listed["jobs"]] == [failed]  # back in its owner's list

    conn.set("test:answers:fixed", 1)  # the errored items can be answered now
    code, text = cli("replay", "--errored-items", jobs["item_errors"])
    assert code == 0 and "replayed 1" in text, text
    run_burst()
    code, text = cli("status", jobs["item_errors"], "--json")
    assert code == 0 and json.loads(text)["outcome"] == "succeeded", text
    assert item_calls(conn, jobs["item_errors"]) == {1: 1, 3: 1}  # only the two errored items asked again


def test_while_the_archive_does_not_answer_a_job_only_it_holds_is_a_503_and_exit_5(
        conn, archive_url, token_app, env):
    job_id = enqueue(conn, "permanent", {}, owner=OWNER)[0]
    run_burst()
    assert sweep.sweep(conn) == 1
    lose_redis(conn)
    env.setenv("LEASH_ARCHIVE_URL", "postgresql+psycopg://leash@127.0.0.1:9/none")  # nothing listens there
    database.forget()
    client = token_app.test_client()
    for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/result"):
        answer = client.get(path, headers=bearer(OWNER))
        assert answer.status_code == 503 and answer.headers["Retry-After"], path
        assert "the archive did not answer" in answer.get_json()["error"] and "5432" not in answer.get_json()["error"]
    replayed = client.post(f"/jobs/{job_id}/replay", headers=bearer(OWNER))
    assert replayed.status_code == 503
    for args in (("status", job_id), ("results", job_id), ("replay", job_id, "--yes")):
        code, text = cli(*args)
        assert code == exit_codes.UNREACHABLE and "the archive did not answer" in text, (args, text)
    print(text)
    assert conn.dbsize() == 0


def test_a_webhook_delivered_after_the_job_was_archived_reads_as_delivered_from_the_archive(
        app, client, conn, burst, hooks, receiver, archive_url):
    receiver.statuses = [500] * 6
    job_id = client.post("/jobs", json={**CLASSIFY, "webhook_url": receiver.url}).get_json()["job_id"]
    burst()
    assert sweep.sweep(conn) == 1  # archived before its webhook went: the archived record says "to send"
    outbox.sweep(conn)
    burst(follow=5)
    before = client.get(f"/jobs/{job_id}").get_json()
    assert before["webhook"]["state"] == "delivered" and before["webhook"]["attempts"] == 7
    assert len(before["webhook"]["deliveries"]) == 7  # the address shows every attempt
    kept = json.loads(cli("status", job_id, "--json")[1])
    assert len(kept["webhook"]["deliveries"]) == delivery.LOG_KEPT  # the command line, the record's last few
    lose_redis(conn)
    assert client.get(f"/jobs/{job_id}").get_json() == before | {"source": "archive"}
    assert json.loads(cli("status", job_id, "--json")[1]) == kept | {"source": "archive"}


def test_a_record_put_back_reads_as_the_archive_read_it_and_one_redis_holds_is_left_alone(conn, archive_url):
    job_id = enqueue(conn, "permanent", {}, owner=OWNER, name="lost and found")[0]
    run_burst()
    assert sweep.sweep(conn) == 1
    lose_redis(conn)
    archived = job_status.status(conn, job_id, now=0)
    assert (archived["source"], archived["state"], archived["attempts"]) == ("archive", "failed", 1)
    assert restore.records(conn, [job_id, "no-such-job"]) == {job_id: "restored"}
    assert job_status.status(conn, job_id, now=0) == archived | {"source": "redis"}
    assert settings().result_ttl - 60 < conn.ttl(keys.job(job_id)) <= settings().result_ttl
    assert conn.zscore(keys.FAILED_INDEX, job_id) is not None  # in the failure groups again
    assert [job["job_id"] for job in listing.find(conn, OWNER, 0, 10, listing.Filters(view="failed")).jobs] == [job_id]
    conn.hset(keys.job(job_id), "name", "changed since")
    assert restore.records(conn, [job_id]) == {}  # Redis holds its record: left as it is
    assert conn.hget(keys.job(job_id), "name") == b"changed since"


def test_a_pipeline_whose_first_stages_record_left_redis_reads_it_from_the_archive(
        conn, model_server, archive_url, token_app):
    """An earlier stage's record expires before its pipeline's (each later stage's start and end
    keeps the pipeline alive): the pipeline reads that stage as the stage's address does, not as
    expired, so it still reads succeeded and ended (its webhook's body is this status too)."""
    client = token_app.test_client()
    body = {"name": "two steps", "stages": [
        {"name": "answers", "kind": "prompt", "items": ["x", "y"], "template": "{item}"},
        {"name": "again", "kind": "prompt", "items_from": {"stage": "answers", "results": True}, "template": "{item}"}]}
    submitted = client.post("/pipelines", json=body, headers=bearer(OWNER))
    assert submitted.status_code == 202, submitted.get_json()
    pipeline_id = submitted.get_json()["pipeline_id"]
    first = submitted.get_json()["stages"][0]["job_id"]
    run_burst()
    before = client.get(f"/pipelines/{pipeline_id}", headers=bearer(OWNER)).get_json()
    assert (before["state"], before["ended"]) == ("succeeded", True)
    assert [stage["source"] for stage in before["stages"]] == ["redis", "redis"]
    assert sweep.sweep(conn) == 2
    conn.delete(keys.job(first))  # its record's expiry came first; the pipeline's record is still there
    after = client.get(f"/pipelines/{pipeline_id}", headers=bearer(OWNER)).get_json()
    print(after["state"], after["ended"], [(stage["state"], stage["source"], stage["words"]) for stage in after["stages"]])
    assert (after["state"], after["ended"], after["deciding_stage"]) == ("succeeded", True, None)
    assert after["stages"][0] == before["stages"][0] | {"source": "archive"}
    assert client.get(f"/jobs/{first}", headers=bearer(OWNER)).get_json()["state"] == after["stages"][0]["state"]
    code, text = cli("pipeline", "status", pipeline_id)
    assert code == 0 and "expired" not in text and "two steps: succeeded" in text, text


#: Ids no job has: one with a NUL character (which PostgreSQL's text cannot hold, so a query for
#: it is refused), one far longer than any id, one of odd characters.
ODD_IDS = ("no\x00such", "x" * 5000, "a b'; --é😀")


def test_an_id_no_job_can_have_is_the_404_an_unknown_id_gets_never_the_archives_503(conn, archive_url, token_app):
    from urllib.parse import quote

    client = token_app.test_client()
    for job_id in ODD_IDS:
        quoted = quote(job_id, safe="")
        for method, path in (("get", f"/jobs/{quoted}"), ("get", f"/jobs/{quoted}/result"),
                             ("get", f"/jobs/{quoted}/result.csv"), ("post", f"/jobs/{quoted}/replay"),
                             ("post", f"/jobs/{quoted}/cancel"), ("post", f"/jobs/{quoted}/look")):
            answer = getattr(client, method)(path, headers=bearer(OWNER))
            assert (answer.status_code, answer.get_json()) == (404, {"error": "no such job"}), (job_id[:20], path[:40])
        for args in (("status", job_id), ("results", job_id), ("cancel", job_id), ("replay", job_id, "--yes")):
            code, text = cli(*args)
            assert code == exit_codes.BAD_INPUT and "no such job" in text, (job_id[:20], args[0], code, text)
    print("404 for", len(ODD_IDS), "odd ids on every door; archive", archive_url.split(":")[0])


def test_a_replays_dry_run_reads_a_job_redis_lost_from_the_archive_and_says_what_the_replay_would(
        conn, archive_url):
    jobs = ended_jobs(conn)
    by_items = enqueue(conn, "answers", {"items": ["one", "bad two", "three", "bad four"], "max_item_errors": 1},
                       owner=OWNER)[0]  # fails by its item errors
    run_burst()
    asked = [("replay", "--dry-run", jobs["failed"]), ("replay", "--dry-run", "--json", jobs["failed"]),
             ("replay", "--dry-run", by_items), ("replay", "--dry-run", "--json", by_items),
             ("replay", "--errored-items", "--dry-run", jobs["item_errors"]),
             ("replay", "--errored-items", "--dry-run", by_items)]
    held = {args: cli(*args) for args in asked}  # what it says while Redis holds them
    assert sweep.sweep(conn) == 6
    lose_redis(conn)
    for args in asked:
        print(" ".join(args[1:-1]), "->", held[args][1].strip().replace("\n", " | "))
        assert cli(*args) == held[args], args
    assert held[asked[0]][0] == 0 and held[asked[0]][1].startswith("would replay 1 job\n")
    assert "would ask its 2 errored items again" in held[asked[2]][1]
    assert json.loads(held[asked[3]][1])["would_replay"][0]["errored_items_asked"] == 2
    assert held[asked[4]][1] == f"would ask 2 errored items of {jobs['item_errors']} again\n"
    code, text = cli("replay", "--dry-run", jobs["failed"], "no-such-job")
    assert code == exit_codes.BAD_INPUT and "no such job: no-such-job" in text, text
    code, text = cli("replay", "--errored-items", "--dry-run", "no-such-job")
    assert code == exit_codes.BAD_INPUT and "no such job: no-such-job" in text, text
    assert conn.dbsize() == 0  # nothing written to Redis

    # What the replay then does is what its dry run said.
    code, text = cli("replay", "--yes", jobs["failed"])
    assert code == 0 and text == held[asked[0]][1].replace("would replay", "replayed"), text
    # A job Redis holds whose items left it (LEASH_REDIS_KEEP after it was archived): they are
    # counted from the archive, as the replay puts them back.
    conn.delete(keys.payload(jobs["failed"]), keys.items(jobs["failed"]))
    code, text = cli("replay", "--errored-items", "--dry-run", jobs["item_errors"])
    assert (code, text) == held[asked[4]]
    restore.records(conn, [jobs["item_errors"]])  # its record back, its items still only archived
    assert not conn.exists(keys.items(jobs["item_errors"]))
    assert cli("replay", "--errored-items", "--dry-run", jobs["item_errors"]) == held[asked[4]]
