"""A pipeline's webhook: one signed POST once every stage has ended (succeeded, or canceled with
the pipeline), retried as a job's webhook is, each attempt shown in the pipeline's status."""

from __future__ import annotations

from jobs.intake import pipelines, submission
from jobs.read import pipeline_view
from jobs.webhooks import outbox
from tests.test_webhooks import hooks, verified  # noqa: F401 - a fixture
from tests.web_support import CLASSIFY


def submitted(conn, url: str):
    body = {"name": "hooked", "webhook_url": url, "stages": [
        {"name": "classify", **{k: v for k, v in CLASSIFY.items()}},
        {"name": "shout", "kind": "count", "delay": 0, "items_from": {"stage": "classify", "label": "negative"}}]}
    return pipelines.submit(conn, pipelines.read(body, "shared"), submission)


def status(conn, pipeline_id):
    return pipeline_view.status(conn, pipeline_view.read_record(conn, pipeline_id))


def run_webhooks(conn, burst, sweeps: int = 3) -> None:
    """Work the stages, let the sweep see each stage end, work the deliveries."""
    for _ in range(sweeps):
        burst()
        outbox.sweep(conn)
    burst()


def test_one_webhook_when_the_last_stage_ends(conn, burst, hooks, receiver):  # noqa: F811
    pipeline = submitted(conn, receiver.url)
    assert status(conn, pipeline.pipeline_id)["webhook"]["state"] == "waiting"
    run_webhooks(conn, burst)
    bodies = [verified(h, b) for h, b in receiver.received]
    pipeline_events = [b for b in bodies if b["type"].startswith("pipeline.")]
    assert len(pipeline_events) == 1, bodies
    event = pipeline_events[0]
    assert event["type"] == "pipeline.succeeded" and event["data"]["pipeline_id"] == pipeline.pipeline_id
    assert [s["state"] for s in event["data"]["stages"]] == ["succeeded", "succeeded"]
    assert receiver.received[-1][0]["webhook-id"] == f"msg_{pipeline.pipeline_id}"
    hook = status(conn, pipeline.pipeline_id)["webhook"]
    assert hook["state"] == "delivered" and hook["attempts"] == 1 and hook["status"] == 200
    outbox.sweep(conn)  # the stages seen again: nothing sent twice
    burst()
    assert len([1 for _, b in receiver.received if '"type":"pipeline.' in b]) == 1


def test_a_canceled_pipeline_sends_pipeline_canceled_once_retried_until_delivered(conn, burst, hooks, receiver):  # noqa: F811
    receiver.statuses = [500]  # the first attempt fails, the retry delivers
    pipeline = submitted(conn, receiver.url)
    from jobs.core import control

    pipelines.cancel(conn, pipeline.pipeline_id, control.cancel)
    run_webhooks(conn, burst)
    events = [verified(h, b) for h, b in receiver.received]
    assert [e["type"] for e in events] == ["pipeline.canceled", "pipeline.canceled"]
    assert events[0] == events[1]  # the same body on every attempt
    hook = status(conn, pipeline.pipeline_id)["webhook"]
    assert hook["state"] == "delivered" and hook["attempts"] == 2


def test_a_pipeline_that_ends_again_after_a_replay_says_so_in_a_new_webhook(conn, burst, hooks, receiver, model_server):  # noqa: F811
    from click.testing import CliRunner

    from cli import main
    from tests.fake_openai import Reply

    items = ["kettle -> negative", "lid -> negative", "cord -> positive"]
    for item in items[:2]:
        model_server.on(item, Reply("banana"), times=2)  # off-label, and again when corrected: errors
    body = {"name": "hooked", "webhook_url": receiver.url, "stages": [
        {"name": "classify", "kind": "classify", "items": items, "labels": ["positive", "negative"],
         "max_item_errors": 0},
        {"name": "again", "kind": "prompt", "template": "Why: {item}", "after_policy": "run",
         "items_from": {"stage": "classify", "label": "negative"}}]}
    pipeline = pipelines.submit(conn, pipelines.read(body, "shared"), submission)
    run_webhooks(conn, burst)
    assert status(conn, pipeline.pipeline_id)["state"] == "failed"
    replay = CliRunner().invoke(main, ["replay", "--errored-items", "--", pipeline.stages[0][1]])
    assert replay.exit_code == 0, replay.output
    run_webhooks(conn, burst)
    assert status(conn, pipeline.pipeline_id)["state"] == "succeeded"
    events = [verified(h, b) for h, b in receiver.received if '"type":"pipeline.' in b]
    # What the receiver last heard is what the pipeline's status says.
    assert [e["type"] for e in events] == ["pipeline.failed", "pipeline.succeeded"], events
    assert len({h["webhook-id"] for h, b in receiver.received if '"type":"pipeline.' in b}) == 2
    hook = status(conn, pipeline.pipeline_id)["webhook"]
    assert hook["state"] == "delivered" and hook["attempts"] == 1
