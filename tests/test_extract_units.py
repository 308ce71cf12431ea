"""Pure logic of answers with a shape (no Redis, no server): the schema is part of the request
as sent (its digest, its input bound), each provider is told it in its own terms, and answers
are judged by the schema."""

from __future__ import annotations

import pytest

from jobs.models import structured
from jobs.models.anthropic_backend import AnthropicBackend
from jobs.models.calls import ModelSettings
from jobs.models.openai_backend import OpenAIBackend
from jobs.models.provider import CallRequest

SCHEMA = {"type": "object", "properties": {"product": {"type": "string"}, "stars": {"type": "integer"}},
          "required": ["product", "stars"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Extract: a good pen"}]


def bare(cls):
    """A backend with its settings and nothing connected: enough to build requests and digests."""
    backend = cls.__new__(cls)
    backend.settings = ModelSettings(url=None, name="m", api_key="k", timeout=10, max_inline_wait=1, rpm=0, tpm=0,
                                     temperature=None)
    backend.token_limit_field = "max_tokens"
    return backend


def test_the_schema_is_part_of_the_request_digest_and_of_its_input_bound():
    backend = bare(OpenAIBackend)
    plain = CallRequest(MESSAGES, 100)
    shaped = CallRequest(MESSAGES, 100, response_format=structured.response_format(SCHEMA))
    other = CallRequest(MESSAGES, 100, response_format=structured.response_format({**SCHEMA, "required": ["product"]}))
    assert len({backend._digest(plain), backend._digest(shaped), backend._digest(other)}) == 3
    assert backend._digest(shaped) == backend._digest(CallRequest(list(MESSAGES), 100,
                                                                  response_format=structured.response_format(SCHEMA)))
    assert shaped.input_bound() > plain.input_bound() + len(str(SCHEMA)) // 2


def test_openai_gets_a_strict_json_schema_or_json_mode_as_configured(env):
    backend = bare(OpenAIBackend)
    request = CallRequest(MESSAGES, 100, response_format=structured.response_format(SCHEMA))
    assert backend._body(request)["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "extract", "schema": SCHEMA, "strict": True}}
    assert "response_format" not in backend._body(CallRequest(MESSAGES, 100))
    env.setenv("LEASH_MODEL_STRUCTURED_OUTPUT", "json")
    assert backend._body(request)["response_format"] == {"type": "json_object", "schema": SCHEMA}
    assert structured.messages("{item}", "x", SCHEMA, "json")[0]["role"] == "system"  # the schema in the prompt
    env.setenv("LEASH_MODEL_STRUCTURED_OUTPUT", "prompt")
    assert "response_format" not in backend._body(request)


def test_anthropic_gets_one_tool_whose_input_schema_is_the_schema_and_must_call_it():
    params = bare(AnthropicBackend)._params(CallRequest(MESSAGES, 100,
                                                        response_format=structured.response_format(SCHEMA)))
    assert params["tools"][0]["input_schema"] == SCHEMA and params["tools"][0]["name"] == "extract"
    assert params["tool_choice"] == {"type": "tool", "name": "extract"}


@pytest.mark.parametrize(("text", "problem"), [
    ('{"product": "pen", "stars": 5}', None),
    ('```json\n{"product": "pen", "stars": 5}\n```', None),
    ('{"product": "pen"}', "'stars' is a required property"),
    ('{"product": "pen", "stars": "five"}', "'five' is not of type 'integer' (at /stars)"),
    ('{"product": "pen", "stars": 5, "extra": 1}', "Additional properties are not allowed"),
    ("Sure! Here it is", "not JSON"),
])
def test_an_answer_is_judged_by_the_schema(text, problem):
    value, found = structured.check_answer(text, structured.validator(SCHEMA))
    if problem is None:
        assert found is None and value == {"product": "pen", "stars": 5}
    else:
        assert value is None and problem in found


def test_strict_mode_problems_name_the_property():
    nested = {"type": "object", "additionalProperties": False, "required": ["a"],
              "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}}}
    assert "property 'a' needs" in structured.strict_problem(nested)
    assert structured.strict_problem(SCHEMA) is None
    assert structured.count_properties(nested) == 2
