"""Pipelines from the command line: leash submit --pipeline FILE (YAML or JSON), leash pipeline
status and cancel, the dry run, and refusals that name the stage and write nothing."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cli import main
from jobs.core import states

YAML = """
name: reviews
stages:
  - name: classify
    kind: classify
    items_file: reviews.txt
    labels: [positive, negative]
  - name: shout
    kind: count
    delay: 0
    items_from: {stage: classify, label: negative}
"""


def run(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


def pipeline_file(tmp_path, text=YAML, name="pipeline.yaml"):
    (tmp_path / "reviews.txt").write_text("good film\nbad film\nawful plot\n")
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_submit_pipeline_from_yaml_prints_the_id_and_each_stage(conn, env, tmp_path):
    result = run("submit", "--pipeline", pipeline_file(tmp_path))
    assert result.exit_code == 0, result.output
    pipeline_id = result.stdout.strip()
    assert "stage classify:" in result.stderr and "stage shout:" in result.stderr
    assert f"/pipelines/{pipeline_id}" in result.stderr
    status = json.loads(run("pipeline", "status", pipeline_id, "--json").stdout)
    assert [s["name"] for s in status["stages"]] == ["classify", "shout"] and status["state"] == "queued"
    assert status["stages"][0]["total"] == 3
    listed = run("pipeline", "list")
    assert listed.exit_code == 0 and listed.stdout.startswith(pipeline_id) and "[classify queued, shout queued]" in listed.stdout
    shown = run("status", status["stages"][1]["job_id"]).stdout
    assert f"a stage of {pipeline_id} (leash pipeline status {pipeline_id})" in shown


def test_submit_pipeline_from_json_with_json_output_then_status_and_cancel(conn, env, tmp_path, burst):
    body = {"stages": [{"name": "one", "kind": "count", "items": ["a", "b"], "delay": 0},
                       {"name": "two", "kind": "count", "items_from": {"stage": "one"}, "delay": 0}]}
    result = run("submit", "--pipeline", pipeline_file(tmp_path, json.dumps(body), "p.json"), "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["created"] and [s["name"] for s in answer["stages"]] == ["one", "two"]
    canceled = run("pipeline", "cancel", answer["pipeline_id"], "--json")
    assert canceled.exit_code == 0, canceled.output
    assert [s["canceled"] for s in json.loads(canceled.stdout)["stages"]] == [True, True]
    for stage in answer["stages"]:
        assert states.status(conn, stage["job_id"])["canceled"]
    status = run("pipeline", "status", answer["pipeline_id"])
    assert status.exit_code == 1 and "canceled" in status.stdout
    again = run("pipeline", "cancel", answer["pipeline_id"])
    assert again.exit_code == 1 and "had already failed" in again.stdout


def test_status_of_a_finished_pipeline_lists_every_stage(conn, env, tmp_path, burst):
    pipeline_id = run("submit", "--pipeline", pipeline_file(tmp_path)).stdout.strip()
    burst()
    result = run("pipeline", "status", pipeline_id)
    assert result.exit_code == 0, result.output
    assert "pipeline reviews: succeeded" in result.stdout
    assert "1. classify (classify) succeeded 3/3" in result.stdout and "2. shout (count) succeeded" in result.stdout


def test_the_dry_run_prints_each_stage_and_the_worst_case_and_writes_nothing(conn, env, tmp_path):
    result = run("submit", "--pipeline", pipeline_file(tmp_path), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "stage 1 classify (classify)" in result.stdout
    assert "stage 2 shout (count), priced at all 3 items of stage 'classify' (worst case)" in result.stdout
    assert "the pipeline:" in result.stdout and "worst case" in result.stdout
    assert not conn.keys("leash:job:*") and not conn.keys("leash:pipeline:*")
    as_json = json.loads(run("submit", "--pipeline", pipeline_file(tmp_path), "--dry-run", "--json").stdout)
    assert as_json["estimate"]["items"] == 6


def test_refusals_name_the_stage_or_the_file_and_exit_2(conn, env, tmp_path):
    bad_stage = YAML.replace("labels: [positive, negative]", "labels: []")
    result = run("submit", "--pipeline", pipeline_file(tmp_path, bad_stage))
    assert result.exit_code == 2 and "stage 'classify'" in result.output and "Traceback" not in result.output
    assert not conn.keys("leash:job:*") and not conn.keys("leash:pipeline:*")
    broken = run("submit", "--pipeline", pipeline_file(tmp_path, "stages: [\n", "broken.yaml"))
    assert broken.exit_code == 2 and "not valid YAML" in broken.output
    missing = run("submit", "--pipeline", str(tmp_path / "nope.yaml"))
    assert missing.exit_code == 2 and "cannot read" in missing.output
    no_items = run("submit", "--pipeline", pipeline_file(tmp_path, YAML.replace("reviews.txt", "gone.txt")))
    assert no_items.exit_code == 2 and "items_file" in no_items.output
    extra = run("submit", "--pipeline", pipeline_file(tmp_path), "--labels", "a,b")
    assert extra.exit_code == 2 and "--labels does not go with --pipeline" in extra.output
    assert not conn.keys("leash:job:*")
    unknown = run("pipeline", "status", "p-nope")
    assert unknown.exit_code == 2 and "no such pipeline" in unknown.output
