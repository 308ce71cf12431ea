"""Usage is recorded with the item it produced, and a budget is checked before a call is sent:
the Lua side (heartbeat_v4, usage_record_v3, model_admit_v3) against a real Redis."""

from __future__ import annotations

import json
import threading

import pytest
import redis

from jobs import keys
from jobs.core import lease, states
from jobs.enqueue import enqueue
from jobs.errors import InvalidJob
from jobs.lifecycle import scripts
from jobs.usage import budget as budgets
from jobs.usage.meter import Meter, Pending, flush, utc_day
from jobs.usage.prices import Price, parse_overrides, price_for
from jobs.usage.report import owner_usage

from .web_support import TOKENS, bearer

NOW = 1_790_000_000.0  # a fixed instant: one UTC day for the whole test
DAY = utc_day(NOW)


def submit(conn, owner="alice", **payload) -> str:
    payload = {"items": ["a", "b", "c"], "labels": ["x", "y"]} | payload
    job_id, _ = enqueue(conn, "classify", payload, owner=owner, now=NOW)
    return job_id


def admit(conn, attempt, tokens=100, nusd=None):
    return budgets.admit(conn, [keys.model_rate("m", b) for b in ("requests", "tokens", "paused")], 0, 0, 0,
                         attempt, tokens, nusd, now=NOW)


def used(conn, job_id) -> dict:
    return states.status(conn, job_id, now=NOW)


def test_an_item_write_carries_its_calls_usage_to_the_job_attempt_item_owner_day_and_model(conn, env):
    job_id = submit(conn)
    attempt = lease.claim(conn, job_id, "leash", "w", now=NOW)
    attempt.heartbeat(item=(0, '"x"'), now=NOW,
                      usage=Pending("m", "classify", calls=2, input=100, output=7, cached=40, nusd=5_000))
    attempt.heartbeat(item=(1, '"y"'), now=NOW, usage=Pending("m", "classify", calls=1, input=50, output=3, nusd=2_000))
    fields = used(conn, job_id)
    assert fields["usage"] == {"calls": 3, "input_tokens": 150, "output_tokens": 10, "cached_input_tokens": 40,
                               "estimated": False, "estimated_calls": 0, "cache_hits": 0}
    assert fields["cost_usd"] == pytest.approx(7e-6)
    assert conn.hget(keys.usage(job_id), "i0") == b"2,100,7,0" and conn.hget(keys.usage(job_id), "a1:calls") == b"3"
    day = conn.hgetall(keys.usage_owner_day("alice", DAY))
    assert day[b"input_tokens"] == b"150" and day[b"by|m|classify|output_tokens"] == b"10"
    assert conn.hget(keys.usage_model("m"), "calls") == b"3"
    # Every key it wrote expires (the job hash expires when the job ends, as before).
    assert conn.ttl(keys.usage(job_id)) > 0 and conn.ttl(keys.usage_owner_day("alice", DAY)) > 0


def test_a_refused_write_stores_no_item_but_still_counts_the_calls_that_were_paid_for(conn, env):
    job_id = submit(conn)
    zombie = lease.claim(conn, job_id, "leash", "w", now=NOW)
    conn.hset(keys.job(job_id), mapping={"state": "queued"})  # the lease went to someone else
    successor = lease.claim(conn, job_id, "leash", "w2", now=NOW)
    with pytest.raises(lease.LeaseLost):
        zombie.heartbeat(item=(0, '"late"'), now=NOW, usage=Pending("m", "classify", calls=1, input=10, output=2))
    assert conn.hget(keys.items(job_id), "0") is None and conn.hget(keys.usage(job_id), "i0") is None
    assert used(conn, job_id)["usage"]["calls"] == 1
    successor.heartbeat(item=(0, '"x"'), now=NOW, usage=Pending("m", "classify", calls=1, input=10, output=2))
    assert used(conn, job_id)["usage"]["input_tokens"] == 20


def _lose_first_reply(monkeypatch, script: str) -> list[str]:
    """The first run of ``script`` lands in Redis, then its reply is lost (the connection
    drops, as in a failover): the attempt sends the same write again. Returns the runs made."""
    real, runs = scripts.run, []

    def run(connection, name, *args, **kwargs):
        reply = real(connection, name, *args, **kwargs)
        if name == script:
            runs.append(name)
            if len(runs) == 1:
                raise redis.exceptions.ConnectionError("Connection closed by server.")
        return reply

    monkeypatch.setattr(scripts, "run", run)
    return runs


def test_an_item_write_sent_again_after_its_reply_was_lost_counts_its_calls_once(conn, env, monkeypatch):
    job_id = submit(conn)
    attempt = lease.claim(conn, job_id, "leash", "w", now=NOW)
    settled = admit(conn, attempt, tokens=500)
    admit(conn, attempt, tokens=300)  # another call, still in flight
    runs = _lose_first_reply(monkeypatch, "heartbeat_v4")
    attempt.heartbeat(item=(0, '"x"'), now=NOW, usage=Pending("m", "classify", calls=2, input=100, output=7, nusd=5_000,
                                                            day=settled.day, reservations=[settled.reservation]))
    assert len(runs) == 2  # the write was sent twice
    assert conn.hget(keys.items(job_id), "0") == b'"x"'
    fields = used(conn, job_id)
    assert fields["usage"]["calls"] == 2 and fields["usage"]["input_tokens"] == 100
    assert conn.hget(keys.usage(job_id), "a1:calls") == b"2"
    assert conn.hget(keys.usage_owner_day("alice", DAY), "cost_nusd") == b"5000"
    assert conn.hget(keys.usage_model("m"), "calls") == b"2"
    # The reservation was settled once, not twice (it would go below what other calls hold).
    assert conn.hget(keys.job(job_id), "in_flight_tokens") == b"300"
    assert conn.hget(keys.usage_owner_day("alice", DAY), "reserved_tokens") == b"300"
    # The next write of the same thread is a new one and counts.
    attempt.heartbeat(item=(1, '"y"'), now=NOW, usage=Pending("m", "classify", calls=1, input=10, output=1))
    assert used(conn, job_id)["usage"]["calls"] == 3


def test_many_items_written_again_after_a_lost_reply_count_their_calls_once(conn, env, monkeypatch):
    job_id = submit(conn)
    attempt = lease.claim(conn, job_id, "leash", "w", now=NOW)
    runs = _lose_first_reply(monkeypatch, "store_items_v2")
    attempt.store_items([(0, '"x"', "1,5,2"), (1, '"y"', "1,5,2")], Pending("m", "classify", calls=2, input=10,
                                                                             output=4), now=NOW)
    assert len(runs) == 2
    assert used(conn, job_id)["usage"]["calls"] == 2
    assert conn.hget(keys.usage_model("m"), "input_tokens") == b"10"


def test_writes_of_different_threads_or_attempts_are_never_taken_for_a_repeat(conn, env):
    """Only a write's own repeat is skipped: threads of one attempt land their writes in any
    order, and a later attempt numbers its writes afresh."""
    job_id = submit(conn, items=[str(i) for i in range(41)])
    attempt = lease.claim(conn, job_id, "leash", "w", now=NOW)
    attempt.heartbeat(item=(40, '"r"'), now=NOW, usage=Pending("m", "classify", calls=1, input=3))

    # All four are alive until all have written: a finished thread's id can be given to the next.
    all_written = threading.Barrier(4)

    def write(start: int) -> None:
        for index in range(start, 40, 4):
            attempt.heartbeat(item=(index, '"r"'), now=NOW, usage=Pending("m", "classify", calls=1, input=3))
        all_written.wait(timeout=30)

    threads = [threading.Thread(target=write, args=(start,)) for start in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert used(conn, job_id)["usage"]["calls"] == 41 and conn.hlen(keys.items(job_id)) == 41
    # A later claim under the same attempt number (a hand-off, a replay), in a process whose
    # thread ids may be the same, numbers its writes from 1 again and is counted.
    raw = conn.hgetall(keys.usage(job_id))
    slots = {field for field in raw if field.startswith(b"w" + attempt.token.encode() + b":")}
    assert len(slots) == 5  # one field per thread of the claim
    conn.hset(keys.job(job_id), mapping={"state": "queued", "attempts": "0"})
    successor = lease.claim(conn, job_id, "leash", "w2", now=NOW)
    assert successor.number == attempt.number
    successor.heartbeat(item=(0, '"again"'), now=NOW, usage=Pending("m", "classify", calls=1, input=3))
    assert used(conn, job_id)["usage"]["calls"] == 42


def test_usage_with_no_item_is_flushed_and_an_unpriced_call_makes_the_cost_unknown(conn, env):
    job_id = submit(conn)
    attempt = lease.claim(conn, job_id, "leash", "w", now=NOW)
    meter = Meter("classify")
    meter.record("m", 10, 5, price=None)
    flush(attempt, meter.take_all(), now=NOW)
    fields = used(conn, job_id)
    assert fields["usage"]["calls"] == 1 and fields["cost_usd"] is None


def test_usage_with_no_item_rides_out_a_lost_reply_and_counts_once(conn, env, monkeypatch):
    job_id = submit(conn)
    attempt = lease.claim(conn, job_id, "leash", "w", now=NOW)
    meter = Meter("classify")
    meter.record("m", 10, 5, price=None)
    runs = _lose_first_reply(monkeypatch, "usage_record_v3")
    flush(attempt, meter.take_all(), now=NOW)
    assert len(runs) == 2  # sent again, not given up on
    assert used(conn, job_id)["usage"]["calls"] == 1


def test_a_job_budget_refuses_the_call_that_would_pass_it_counting_calls_in_flight(conn, env):
    job_id = submit(conn, budget={"tokens": 250})
    attempt = lease.claim(conn, job_id, "leash", "w", now=NOW)
    calls = [admit(conn, attempt, tokens=100), admit(conn, attempt, tokens=100)]
    assert [call.code for call in calls] == [budgets.ADMITTED] * 2
    refused = admit(conn, attempt, tokens=100)  # 200 reserved in flight + 100 > 250
    assert refused.code == budgets.OVER_BUDGET
    assert refused.refusal.startswith("budget reached") and "250 tokens" in refused.refusal
    # The two calls come back smaller than their worst case: settled, there is room again.
    attempt.heartbeat(item=(0, '"x"'), now=NOW, usage=Pending("m", "classify", calls=2, input=60, output=20,
                                                            reservations=[call.reservation for call in calls]))
    assert conn.hget(keys.job(job_id), "in_flight_tokens") == b"0"
    assert admit(conn, attempt, tokens=100).code == budgets.ADMITTED  # 80 used + 100 <= 250
    assert admit(conn, attempt, tokens=100).code == budgets.OVER_BUDGET


def test_a_dead_attempts_reservation_holds_until_its_call_can_no_longer_answer_then_frees_itself(conn, env):
    env.setenv("LEASH_OWNER_DAILY_TOKENS", "1000")
    job_id = submit(conn, budget={"tokens": 250})
    first = lease.claim(conn, job_id, "leash", "w", now=NOW)
    assert admit(conn, first, tokens=200).code == budgets.ADMITTED  # then the worker is SIGKILLed
    conn.hset(keys.job(job_id), "state", "queued")
    second = lease.claim(conn, job_id, "leash", "w2", now=NOW)
    assert admit(conn, second, tokens=200).code == budgets.OVER_BUDGET  # the first call may still answer
    deadline = conn.zscore(keys.owner_reservations("alice"), conn.zrange(keys.owner_reservations("alice"), 0, 0)[0])
    assert deadline == NOW + budgets.call_hold(60 + 10, first)  # LEASH_MODEL_TIMEOUT, connecting, lease, slack
    later = budgets.admit(conn, [keys.model_rate("m", b) for b in ("requests", "tokens", "paused")], 0, 0, 0,
                          second, 200, None, now=deadline + 1)
    assert later.code == budgets.ADMITTED  # the dead call's reservation was given back first
    assert conn.hget(keys.usage_owner_day("alice", DAY), "reserved_tokens") == b"200"
    assert conn.hget(keys.job(job_id), "in_flight_tokens") == b"200"
    assert admit(conn, first, tokens=10).code == budgets.LEASE_LOST  # a zombie spends nothing


def test_an_owners_daily_budget_stops_calls_and_submissions_for_the_rest_of_the_utc_day(conn, env):
    env.setenv("LEASH_OWNER_DAILY_TOKENS", "150")
    job_id = submit(conn)
    attempt = lease.claim(conn, job_id, "leash", "w", now=NOW)
    attempt.heartbeat(item=(0, '"x"'), now=NOW, usage=Pending("m", "classify", calls=1, input=100, output=20))
    refused = admit(conn, attempt, tokens=40)
    assert refused.code == budgets.OVER_BUDGET and "LEASH_OWNER_DAILY_TOKENS" in refused.refusal
    assert budgets.owner_over_daily(conn, "alice", now=NOW) is None  # 120 of 150: may still submit
    attempt.heartbeat(item=(1, '"x"'), now=NOW, usage=Pending("m", "classify", calls=1, input=30, output=5))
    assert budgets.owner_over_daily(conn, "alice", now=NOW).startswith("budget reached: owner 'alice'")
    assert budgets.owner_over_daily(conn, "bob", now=NOW) is None
    assert 0 < budgets.seconds_to_next_utc_day(NOW) <= 86400 + 1
    report = owner_usage(conn, "alice", days=2, now=NOW)
    assert report["days"][0]["day"] == DAY and report["total"]["usage"]["input_tokens"] == 130
    assert report["days"][0]["by"][0]["model"] == "m" and report["days"][0]["by"][0]["kind"] == "classify"


def test_a_usd_budget_without_a_known_price_is_refused_rather_than_guessed(conn, env):
    job_id = submit(conn, budget={"usd": 1})
    attempt = lease.claim(conn, job_id, "leash", "w", now=NOW)
    refused = admit(conn, attempt, tokens=10, nusd=None)
    assert refused.code == budgets.OVER_BUDGET and "no price for" in refused.refusal  # names the model, what to set
    assert "LEASH_MODEL_PRICES" in refused.refusal
    assert admit(conn, attempt, tokens=10, nusd=500_000_000).code == budgets.ADMITTED
    assert admit(conn, attempt, tokens=10, nusd=600_000_000).code == budgets.OVER_BUDGET  # $0.5 + $0.6 > $1


@pytest.mark.parametrize("bad", [{"tokens": 0}, {"tokens": "10"}, {"usd": -1}, {"usd": True}, {}, {"cents": 5}, 7])
def test_a_malformed_budget_is_refused_before_anything_is_written(conn, env, bad):
    with pytest.raises(InvalidJob, match="budget"):
        submit(conn, budget=bad)
    assert conn.dbsize() == 0


def test_the_api_takes_a_budget_and_answers_a_bad_one_with_422(client):
    ok = client.post("/jobs", json={"kind": "classify", "items": ["a"], "labels": ["x"], "budget": {"tokens": 500}})
    assert ok.status_code == 202
    status = client.get(ok.json["url"]).json
    assert status["budget"] == {"tokens": 500} and status["usage"]["calls"] == 0 and status["cost_usd"] == 0
    bad = client.post("/jobs", json={"kind": "classify", "items": ["a"], "labels": ["x"], "budget": {"usd": "a lot"}})
    assert bad.status_code == 422 and "budget" in bad.json["error"]


def test_get_usage_shows_only_the_callers_own_figures(token_app, conn):
    client = token_app.test_client()
    owners = list(TOKENS)
    for owner, tokens in ((owners[0], 11), (owners[1], 22)):
        job_id = submit(conn, owner=owner)
        attempt = lease.claim(conn, job_id, "leash", "w", now=NOW)
        attempt.heartbeat(item=(0, '"x"'), usage=Pending("m", "classify", calls=1, input=tokens, output=1))
    mine = client.get("/usage", headers=bearer(owners[0])).json
    assert mine["owner"] == owners[0] and mine["total"]["usage"]["input_tokens"] == 11
    assert client.get("/usage").status_code == 401
    assert client.get("/usage?days=0", headers=bearer(owners[0])).status_code == 400


def test_metrics_report_tokens_and_cost_per_model_without_an_owner_label(client, conn):
    conn.sadd(keys.MODELS, "m")
    job_id = submit(conn)
    attempt = lease.claim(conn, job_id, "leash", "w", now=NOW)
    attempt.heartbeat(item=(0, '"x"'), usage=Pending("m", "classify", calls=1, input=1000, output=10, nusd=150_000))
    text = client.get("/metrics").data.decode()
    assert 'leash_model_tokens_total{direction="input",model="m"} 1000.0' in text
    assert 'leash_model_cost_usd_total{model="m"} 0.00015' in text
    assert "owner=" not in text


def test_prices_come_from_the_operator_then_the_maintained_table_and_never_from_a_guess(env):
    env.setenv("LEASH_MODEL_PRICES", json.dumps({"my-model": {"input": 1, "output": 2}}))
    assert price_for("my-model") == Price(1.0, 2.0)
    assert price_for("my-model").nano_usd(1_000_000, 500_000) == 2_000_000_000  # $1 + $1
    table = price_for("gpt-4o-mini", provider_url="")  # api.openai.com: the table knows it
    assert table is not None and table.input == pytest.approx(0.15) and table.output == pytest.approx(0.6)
    # An address the table does not know (a proxy, your own server): the model's name decides.
    assert price_for("gpt-4o-mini", provider_url="http://127.0.0.1:8000/v1").input == table.input
    assert price_for("smollm2-135m") is None
    assert price_for("smollm2-135m", provider_url="http://127.0.0.1:8000/v1") is None
    for bad in ("not json", "[]", '{"m": {"input": -1, "output": 1}}', '{"m": {"input": 1}}'):
        with pytest.raises(ValueError, match="LEASH_MODEL_PRICES"):
            parse_overrides(bad)


def test_the_cli_and_the_page_show_tokens_and_cost_beside_progress(conn, env, client):
    from click.testing import CliRunner

    from cli import main

    env.setenv("LEASH_MODEL_PRICES", json.dumps({"m": {"input": 1, "output": 2}}))
    job_id = submit(conn, owner="shared", budget={"tokens": 5000})
    attempt = lease.claim(conn, job_id, "leash", "w")
    attempt.heartbeat(item=(0, '"x"'), usage=Pending("m", "classify", calls=2, input=1200, output=34,
                                                   nusd=Price(1, 2).nano_usd(1200, 34)))
    runner = CliRunner()
    status = runner.invoke(main, ["status", job_id])
    assert "1,234 tokens (1,200 in / 34 out, 2 calls), $0.001268 of a budget of 5,000 tokens" in status.output
    listed = runner.invoke(main, ["jobs"])
    [row] = [line for line in listed.output.splitlines() if job_id in line]
    assert row.split()[-2:] == ["1,234", "$0.001268"]  # the TOKENS and COST columns
    usage = runner.invoke(main, ["usage", "--days", "1"])
    assert usage.exit_code == 0 and "m / classify" in usage.output and "1,200" in usage.output
    assert json.loads(runner.invoke(main, ["usage", "--json"]).output)["total"]["usage"]["calls"] == 2
    assert runner.invoke(main, ["usage", "--days", "0"]).exit_code == 2
    page = client.get(f"/jobs/{job_id}", headers={"Accept": "text/html"}).data.decode()
    assert "1,234 tokens" in page and "$0.001268" in page


def test_the_form_takes_a_budget_and_names_a_bad_one(client, conn):
    from .web_support import csrf_from

    page = client.get("/", headers={"Accept": "text/html"})
    form = {"csrf_token": csrf_from(page.data), "kind": "classify", "labels": "yes, no", "items": "one\ntwo",
            "submission": "budget-form-1", "budget_tokens": "900", "budget_usd": ""}
    done = client.post("/", data=form)
    assert done.status_code == 303
    job_id = done.headers["Location"].rsplit("/", 1)[1]
    assert states.status(conn, job_id)["budget"] == {"tokens": 900}
    refused = client.post("/", data=form | {"submission": "budget-form-2", "budget_tokens": "-3"})
    assert refused.status_code == 422 and b"a token budget is a whole number of at least 1" in refused.data
    assert conn.zcard(keys.owner_jobs("shared")) == 1


def test_a_worker_names_malformed_prices_once_at_start(env):
    from jobs.models import backends

    env.setenv("LEASH_MODEL_PRICES", "{not json")
    assert "LEASH_MODEL_PRICES must be JSON" in backends.preload()
