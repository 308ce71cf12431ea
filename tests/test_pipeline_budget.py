"""A budget for a whole pipeline, on real leash workers against a stand-in provider that bills
every answer: the stages run one at a time, each starting with what the others left, so what
they bill together never passes the pipeline's budget."""

from __future__ import annotations

from jobs import keys
from jobs.core import states
from jobs.intake import pipelines, submission
from tests.test_budget_spend import ENGLISH, MAX_TOKENS, TEMPLATE, need_of
from tests.test_usage_workers import billed


def pipeline(conn, budget: dict, items: list[str]):
    body = {"name": "budgeted", "budget": budget, "stages": [
        {"name": "first", "kind": "prompt", "items": items, "template": TEMPLATE},
        # Other prompts than the first's: the request cache answers none of them.
        {"name": "second", "kind": "prompt", "items_from": {"stage": "first"}, "template": "Again: {item}"},
        {"name": "third", "kind": "prompt", "items": items, "template": "Third: {item}"}]}
    return pipelines.submit(conn, pipelines.read(body, "dana"), submission)


def test_the_stages_together_never_pass_the_pipelines_budget(conn, burst, model_server, env):
    env.setenv("LEASH_MODEL_MAX_TOKENS", str(MAX_TOKENS))
    items = ENGLISH[:10]
    need = need_of(items)
    budget = int(need * 1.6)  # the first stage and part of the second
    submitted = pipeline(conn, {"tokens": budget}, items)
    first, second, third = (job_id for _, job_id in submitted.stages)
    # One stage at a time: each waits for the one before it.
    assert first in states.status(conn, second)["after"]["jobs"]
    assert second in states.status(conn, third)["after"]["jobs"]
    burst()
    calls, input_tokens, output_tokens = billed(model_server)[:3]
    ends = [states.status(conn, job_id) for job_id in (first, second, third)]
    print(f"need of one stage {need:,} tokens, pipeline budget {budget:,}: billed {input_tokens + output_tokens:,} "
          f"in {calls} calls; stages {[(e['state'], e['done'], e['error']) for e in ends]}")
    assert input_tokens + output_tokens <= budget
    assert ends[0]["state"] == "succeeded"
    assert ends[1]["state"] == "failed" and ends[1]["error"].startswith("budget reached")
    assert ends[2]["state"] == "failed" and ends[2]["canceled"]  # it waited for the second (after_policy cancel)
    counted = sum(e["usage"]["input_tokens"] + e["usage"]["output_tokens"] for e in ends)
    assert counted == input_tokens + output_tokens


def test_a_stage_that_finds_the_budget_spent_fails_before_its_first_call(conn, burst, model_server, env):
    env.setenv("LEASH_MODEL_MAX_TOKENS", str(MAX_TOKENS))
    items = ENGLISH[:4]
    body = {"budget": {"tokens": 1000}, "stages": [
        {"name": "first", "kind": "prompt", "items": items, "template": TEMPLATE, "budget": {"tokens": 5000}},
        {"name": "second", "kind": "prompt", "items": items, "template": "Again: {item}", "after_policy": "run"}]}
    submitted = pipelines.submit(conn, pipelines.read(body, "dana"), submission)
    first, second = (job_id for _, job_id in submitted.stages)
    assert states.status(conn, first)["budget"] == {"tokens": 1000}  # its own, at most the pipeline's
    # As if the first stage had spent the pipeline's budget in an earlier attempt.
    conn.hset(keys.job(first), mapping={"usage_input_tokens": 600, "usage_output_tokens": 400})
    burst()
    end = states.status(conn, second)
    assert states.status(conn, first)["error"].startswith("budget reached")
    assert end["state"] == "failed" and "the pipeline's budget of 1,000 tokens was spent" in end["error"], end["error"]
    assert end["usage"]["calls"] == 0 and billed(model_server)[0] == 0


def test_a_stage_stopped_by_the_pipelines_budget_runs_on_when_replayed_with_a_larger_budget(
        conn, burst, model_server, env):
    from click.testing import CliRunner

    from cli import main

    env.setenv("LEASH_MODEL_MAX_TOKENS", str(MAX_TOKENS))
    items = ENGLISH[:10]
    submitted = pipeline(conn, {"tokens": int(need_of(items) * 1.6)}, items)
    second = submitted.stages[1][1]
    burst()
    stopped = states.status(conn, second)
    assert stopped["state"] == "failed" and "leash replay --budget-tokens" in stopped["error"], stopped["error"]
    # What the error says to do: the user raises this stage's budget past what the pipeline left.
    raised = 10 * need_of(items)
    replay = CliRunner().invoke(main, ["replay", "--budget-tokens", str(raised), "--", second])
    assert replay.exit_code == 0, replay.output
    burst()
    final = states.status(conn, second)
    assert final["state"] == "succeeded", final["error"]
    assert final["done"] == len(items) and final["budget"] == {"tokens": raised}


def test_the_dry_run_prices_a_stage_fed_by_a_reduce_stage_at_its_instruction_the_item_it_gives(
        conn, model_server, env):
    from jobs.intake.submission import dry_run

    env.setenv("LEASH_MODEL_PRICES", '{"fake-model": {"input": 1.0, "output": 2.0}}')
    instruction = "Summarise the complaints, naming each product and what went wrong with it. " * 50
    body = {"stages": [
        {"name": "summary", "kind": "reduce", "instruction": instruction, "items": ENGLISH[:4]},
        {"name": "again", "kind": "prompt", "template": TEMPLATE, "items_from": {"stage": "summary"}}]}
    estimate = pipelines.submit(conn, pipelines.read(body, "dana"), submission, dry_run=True).estimate
    # The reduce job's one result row has its instruction as its item: what "again" is given.
    alone = dry_run(conn, "prompt", {"items": [instruction], "template": TEMPLATE}, owner="dana")
    priced = estimate["stages"][1]["estimate"]
    assert priced["input_tokens"] >= alone["input_tokens"] and priced["cost_usd_max"] >= alone["cost_usd_max"]


def test_a_stage_replayed_with_a_smaller_budget_than_the_pipeline_left_keeps_the_smaller(
        conn, burst, model_server, env):
    from click.testing import CliRunner

    from cli import main
    from jobs.core import control

    env.setenv("LEASH_MODEL_MAX_TOKENS", str(MAX_TOKENS))
    items = ENGLISH[:10]
    submitted = pipeline(conn, {"tokens": 100 * need_of(items)}, items)
    first = submitted.stages[0][1]
    control.cancel(conn, first)  # stopped before it ran; its owner then replays it on a tight budget
    small = need_of(items) // 3
    replay = CliRunner().invoke(main, ["replay", "--budget-tokens", str(small), "--", first])
    assert replay.exit_code == 0, replay.output
    burst()
    final = states.status(conn, first)
    spent = final["usage"]["input_tokens"] + final["usage"]["output_tokens"]
    assert final["budget"] == {"tokens": small} and spent <= small, (final["budget"], spent)
    assert final["state"] == "failed" and final["error"].startswith("budget reached"), final["error"]


def test_a_pipeline_whose_stages_outlast_its_first_expiry_keeps_its_record_and_its_budget(
        conn, burst, model_server, env):
    from jobs.read import pipeline_view

    env.setenv("LEASH_MODEL_MAX_TOKENS", str(MAX_TOKENS))
    env.setenv("LEASH_RESULT_TTL", "3600")
    items = ENGLISH[:10]
    submitted = pipeline(conn, {"tokens": int(need_of(items) * 1.6)}, items)
    # As if its first stage had run for most of the hour the record was first given.
    conn.expire(keys.pipeline(submitted.pipeline_id), 5)
    conn.expire(keys.owner_pipelines("dana"), 5)
    burst()
    # Each stage that started or ended gave the record (and the owner's list) its time again.
    assert conn.ttl(keys.pipeline(submitted.pipeline_id)) > 3000
    assert conn.ttl(keys.owner_pipelines("dana")) > 3000
    assert pipeline_view.listed(conn, "dana")[1] == 1
