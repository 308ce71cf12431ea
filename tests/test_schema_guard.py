"""An ``extract`` schema cannot hurt: references only inside it, patterns matched without
backtracking, its reference expansion bounded at the door, every error its check can raise a
422 at every web door (dry run, submit, the public form's Submit and Estimate), and one
answer's check bounded in time in the worker."""

from __future__ import annotations

import json
import time

import pytest

from jobs.errors import ItemError
from jobs.models import structured
from tests.web_support import HTML, create_app_with, csrf_from


def with_property(**extra) -> dict:
    return {"type": "object", "properties": {"x": {"type": "string", **extra}}, "required": ["x"],
            "additionalProperties": False}


def ref_chain(levels: int = 31) -> dict:
    """Each definition names the next twice: following every reference reaches 2**levels subschemas."""
    schema = {**with_property(), "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": {}}
    for i in range(levels):
        schema["$defs"][f"d{i}"] = {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
    schema["$defs"][f"d{levels}"] = {"type": "string"}
    return schema


REDOS = with_property(pattern="^(a+)+$")
SELF = {"$ref": "#", "type": "object", "properties": {"x": {"type": "string"}}}
NESTED = with_property(pattern="(" * 500 + "a" + ")" * 500)
#: (schema, words the door's 422 says)
REFUSED = {
    "url": (with_property(**{"$ref": "http://127.0.0.1:9/probe.json"}), "$ref 'http://127.0.0.1:9/probe.json'"),
    "file": (with_property(**{"$ref": "file:///etc/passwd"}), "$ref 'file:///etc/passwd'"),
    "relative": ({**with_property(), "$id": "http://127.0.0.1:9/", "properties": {"x": {"$ref": "probe.json"}}},
                 "$ref 'probe.json'"),
    "chain": (ref_chain(), "LEASH_MAX_SCHEMA_EXPANSION"),
    "self": (SELF, "$ref '#' refers back to itself"),
    "loop": ({**with_property(), "properties": {"x": {"$ref": "#/$defs/a"}},
              "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"not": {"$ref": "#/$defs/a"}}}},
             "refers back to itself"),
    "embedded document": ({**with_property(), "properties": {"x": {"$id": "http://127.0.0.1:9/x.json"}}},
                          "$id 'http://127.0.0.1:9/x.json'"),
    "nothing": ({**with_property(), "properties": {"x": {"$ref": "#/$defs/none"}}}, "names nothing"),
    "lookahead": (with_property(pattern="(?=a)b"), "RE2"),
    "backreference": ({**with_property(), "patternProperties": {r"(a)\1": {}}}, "RE2"),
    "bad regex": (with_property(pattern="(["), "RE2"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_the_door_refuses_a_schema_that_could_hurt_naming_why(name):
    schema, words = REFUSED[name]
    started = time.monotonic()
    problem = structured.schema_problem(schema)
    assert problem and words in problem, problem
    assert time.monotonic() - started < 2  # unbounded, these take many seconds to minutes


def test_a_tree_shaped_schema_that_recurses_through_the_answer_is_accepted():
    tree = {"type": "object", "properties": {"name": {"type": "string"},
                                             "children": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["name"]}
    assert structured.schema_problem(tree) is None
    check = structured.validator(tree)
    answer = {"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]}
    assert structured.check_answer(json.dumps(answer), check) == (answer, None)
    assert "is a required property" in structured.check_answer('{"children": []}', check)[1]


def test_patterns_are_matched_without_backtracking():
    assert structured.schema_problem(REDOS) is None  # RE2 compiles it; it cannot backtrack
    assert structured.schema_problem(NESTED) is None  # Python's re would recurse until it crashed
    started = time.monotonic()
    value, problem = structured.check_answer(json.dumps({"x": "a" * 40 + "!"}), structured.validator(REDOS))
    assert value is None and "does not match '^(a+)+$'" in problem
    assert structured.check_answer(json.dumps({"x": "a" * 40}), structured.validator(REDOS))[1] is None
    # Property names too: patternProperties and the additional properties they decide.
    named = {"type": "object", "patternProperties": {"^(a+)+$": {"type": "integer"}}, "additionalProperties": False,
             "properties": {"x": {"type": "string"}}}
    problem = structured.check_answer(json.dumps({"a" * 40 + "!": 1}), structured.validator(named))[1]
    assert "does not match any of the regexes" in problem
    assert structured.check_answer(json.dumps({"aaaa": 1}), structured.validator(named))[1] is None
    assert time.monotonic() - started < 2  # backtracking takes minutes on 40 a's


@pytest.mark.parametrize("draft", ["https://json-schema.org/draft/2020-12/schema",
                                   "https://json-schema.org/draft/2019-09/schema"])
def test_unevaluated_properties_match_pattern_properties_without_backtracking(draft):
    # jsonschema decides what patternProperties evaluated with Python's re: 24 a's and a '!'
    # took it 3.6 s on a quiet core, inside one call no deadline can interrupt; each more a doubles it.
    schema = {"$schema": draft, "type": "object", "properties": {"x": {"type": "string"}},
              "patternProperties": {"^(a+)+$": {"type": "integer"}}, "unevaluatedProperties": False}
    assert structured.schema_problem(schema) is None
    check = structured.validator(schema)
    started = time.monotonic()
    problem = structured.check_answer(json.dumps({"a" * 24 + "!": 1}), check)[1]
    assert time.monotonic() - started < 1.5  # 3.6 s with backtracking
    assert "Unevaluated properties are not allowed ('aaaaaaaaaaaaaaaaaaaaaaaa!' was unexpected)" in problem
    # Under allOf, if/then and $ref too: the same keys are evaluated as jsonschema's own way.
    nested = {"$schema": draft, "type": "object", "properties": {"x": {}}, "$defs": {"p": {"patternProperties": {"^(a+)+$": {}}}},
              "allOf": [{"$ref": "#/$defs/p"}], "if": {"required": ["b"]},
              "then": {"properties": {"b": {}}}, "unevaluatedProperties": {"type": "string"}}
    check = structured.validator(nested)
    started = time.monotonic()
    assert structured.check_answer(json.dumps({"a" * 40: 1, "b": 2, "c": "x"}), check)[1] is None
    problem = structured.check_answer(json.dumps({"a" * 40 + "!": 1, "c": "x"}), check)[1]
    assert "not valid under the given schema" in problem and "'aaaa" in problem
    assert structured.check_answer(json.dumps({"b": 2}), structured.validator({**nested, "if": False}))[1]
    assert time.monotonic() - started < 1.5  # 3.6 s with backtracking


def test_the_validator_never_retrieves_a_reference():
    check = structured.validator(REFUSED["url"][0])  # a schema accepted by an older door
    with pytest.raises(ItemError, match="cannot be checked against the schema"):
        structured.check_answer('{"x": "a"}', check)


def test_checking_one_answer_is_bounded_in_time_and_a_recursion_is_an_item_error(env):
    env.setenv("LEASH_SCHEMA_CHECK_SECONDS", "0.5")
    started = time.monotonic()
    with pytest.raises(ItemError, match="took more than 0.5 s .LEASH_SCHEMA_CHECK_SECONDS"):
        structured.check_answer('{"x": "a"}', structured.validator(ref_chain()))
    assert time.monotonic() - started < 2.5
    with pytest.raises(ItemError, match="refers to itself without end"):
        structured.check_answer('{"x": "a"}', structured.validator(SELF))
    deep = "[" * 100_000 + "]" * 100_000
    assert "nested too deeply" in structured.check_answer(deep, structured.validator(REDOS))[1]


# --- the web doors: a 422 naming the problem, never a 500 -----------------------------------------
HOSTILE = {"redos": REDOS, "nested": NESTED, **{name: schema for name, (schema, _) in REFUSED.items()}}


@pytest.mark.parametrize("name", HOSTILE)
def test_every_door_answers_a_hostile_schema_with_a_422_or_takes_it(conn, name):
    schema = HOSTILE[name]
    words = REFUSED[name][1] if name in REFUSED else None
    app = create_app_with(LEASH_PUBLIC_SUBMIT=True)
    api = app.test_client()
    for dry_run in (True, False):
        response = api.post("/jobs", json={"kind": "extract", "items": ["a" * 40 + "!"], "schema": schema,
                                           "dry_run": dry_run})
        if words is None:
            assert response.status_code in (200, 202), response.get_json()
        else:
            assert response.status_code == 422 and words in response.get_json()["error"], response.get_json()
    visitor = app.test_client()  # anonymous: the public form
    token = csrf_from(visitor.get("/", headers=HTML).data)
    for n, button in enumerate(({"estimate": "1"}, {})):
        response = visitor.post("/", headers=HTML, content_type="multipart/form-data", data={
            "kind": "extract", "items": "a review", "schema": json.dumps(schema), "csrf_token": token,
            "submission": f"hostile-{n:04d}", **button})
        page = response.data.decode()
        if words is None:
            assert response.status_code in (200, 303), page[:500]
        else:
            assert response.status_code == 422, (response.status_code, page[:500])
            assert words.replace("'", "&#39;") in page or words in page
