"""Answers with a shape: what the ``extract`` kind asks a model, how each provider is told the
JSON Schema its answer must follow, and how an answer is checked and repaired.

How a provider is told (a backend's ``structured_output``, or ``LEASH_MODEL_STRUCTURED_OUTPUT``
for an OpenAI-compatible server that lacks what OpenAI has):

    schema   the provider enforces the schema: OpenAI ``response_format: {"type": "json_schema",
             "json_schema": {"name", "schema", "strict": true}}``; Anthropic a tool whose
             ``input_schema`` is the schema, with ``tool_choice`` naming it
    json     JSON mode (``{"type": "json_object", "schema": ...}``: llama-cpp-python's server enforces
             that schema, OpenAI only valid JSON), the schema in the prompt too
    prompt   the schema in the prompt only

Whatever the provider promises, every answer is validated (``jsonschema``, the draft the
schema names, 2020-12 by default). An answer that does not follow the schema is asked again
with the validation error, ``LEASH_REPAIR_ATTEMPTS`` times (each repair a call like any other:
counted, priced, reserved against budgets); one still invalid is the item's error.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

from jobs.config import limits
from jobs.errors import ItemError
from jobs.models import schema_guard

SCHEMA, JSON_MODE, PROMPT = "schema", "json", "prompt"
STRUCTURED_OUTPUTS = (SCHEMA, JSON_MODE, PROMPT)
#: The name the schema goes by at the provider (OpenAI's json_schema.name, Anthropic's tool).
SCHEMA_NAME = "extract"
#: The error of an item whose answers never followed the schema starts with this (the job's
#: error quotes it; ``leash failures`` groups on it).
INVALID = "the answer does not follow the schema"

DEFAULT_TEMPLATE = ("Extract the fields described by the JSON Schema from the text below. Answer with one JSON "
                    "object and nothing else.\n\nText:\n{item}")


def response_format(schema: dict) -> dict:
    """What a ``CallRequest`` carries: the schema and the name it goes by."""
    return {"name": SCHEMA_NAME, "schema": schema}


def messages(template: str, item: str, schema: dict, mode: str) -> list[dict]:
    """The first call about an item. A provider that enforces the schema gets it beside the
    prompt; any other reads it in a system message."""
    user = {"role": "user", "content": template.replace("{item}", item)}
    if mode == SCHEMA:
        return [user]
    return [{"role": "system", "content": "Answer with one JSON object that follows this JSON Schema:\n"
                                          + json.dumps(schema, separators=(",", ":"))}, user]


def validator(schema: dict):
    """What checks answers against ``schema``: references only inside it, patterns by RE2, each
    answer's check bounded in time (jobs.models.schema_guard)."""
    return schema_guard.safe_validator(schema)


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` is not a JSON Schema an answer can be checked against, or could hurt the
    worker that checks them (jobs.models.schema_guard), or None."""
    if not isinstance(schema, dict):
        return "must be a JSON object (a JSON Schema)"
    problem = schema_guard.door_problem(schema, limits().max_schema_expansion)
    if problem:
        return problem
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema, format_checker=schema_guard.regex_format_checker())
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"is not a valid JSON Schema: {exc.message}" + (f" (at {where})" if where else "")
    except (RecursionError, ValueError, TypeError, LookupError) as exc:  # the check itself gave up: a 422, not a 500
        return f"cannot be checked as a JSON Schema ({type(exc).__name__}: {str(exc)[:120]})"
    if schema.get("type") != "object" or not isinstance(schema.get("properties"), dict) or not schema["properties"]:
        return 'must describe an object: "type": "object" with at least one property in "properties"'
    return None


def strict_problem(schema: dict) -> str | None:
    """What OpenAI's strict structured outputs refuse in ``schema``, or None: every object
    needs ``"additionalProperties": false`` and every property listed in ``required``."""
    pending: list[tuple[Any, str]] = [(schema, "the schema")]
    while pending:
        node, where = pending.pop()
        if isinstance(node, list):
            pending.extend((child, where) for child in node)
            continue
        if not isinstance(node, dict):
            continue
        props = node.get("properties")
        if isinstance(props, dict) or node.get("type") == "object":
            if node.get("additionalProperties") is not False:
                return f'{where} needs "additionalProperties": false (OpenAI\'s strict mode)'
            missing = [name for name in (props or {}) if name not in (node.get("required") or [])]
            if missing:
                return (f"{where}: every property must be in \"required\" (OpenAI's strict mode; "
                        f"make it nullable instead): missing {', '.join(map(repr, missing[:5]))}")
        for key, child in node.items():
            if key == "properties" and isinstance(child, dict):
                pending.extend((value, f"property {name!r}") for name, value in child.items())
            elif isinstance(child, dict | list) and key not in ("enum", "const", "default", "examples"):
                pending.append((child, where))
    return None


def count_properties(schema: Any) -> int:
    """Properties declared anywhere in the schema."""
    total, pending = 0, [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if isinstance(node.get("properties"), dict):
                total += len(node["properties"])
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return total


def columns(schema: Any) -> list[str]:
    """The top-level properties, in the schema's order (a CSV column each)."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    return [str(name) for name in props] if isinstance(props, dict) else []


def check_answer(text: str, check) -> tuple[Any, str | None]:
    """(the object, None) when ``text`` is JSON that follows the schema, else (None, what is
    wrong). A fenced block (```json ... ```) is read as its content."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0]
    try:
        value = json.loads(body)
    except ValueError as exc:
        return None, f"not JSON ({exc.msg} at character {exc.pos})"
    except RecursionError:
        return None, "not JSON this reader takes (nested too deeply)"
    seconds = limits().schema_check_seconds
    try:
        error = jsonschema.exceptions.best_match(schema_guard.iter_errors(check, value, seconds))
    # A check that cannot finish is the item's error (named, in this attempt), never the worker's.
    except TimeoutError:
        raise ItemError(f"checking the answer against the schema took more than {seconds:g} s "
                        "(LEASH_SCHEMA_CHECK_SECONDS)") from None
    except RecursionError:
        raise ItemError("the answer cannot be checked against the schema: it refers to itself without end") from None
    except Exception as exc:  # whatever a schema that passed an older door makes the validator raise
        raise ItemError(f"the answer cannot be checked against the schema: {type(exc).__name__}: "
                        f"{str(exc)[:200]}") from None
    if error is None:
        return value, None
    where = "/".join(str(p) for p in error.absolute_path)
    return None, f"{error.message}" + (f" (at /{where})" if where else "")


def repair_turn(answer: str, problem: str) -> list[dict]:
    """The turns that ask again: the answer given, then what is wrong with it."""
    return [{"role": "assistant", "content": answer[:4000] or "(no answer)"},
            {"role": "user", "content": f"That answer does not follow the JSON Schema: {problem}. Reply with the "
                                        "corrected JSON object only."}]


def invalid_error(problem: str, repairs: int) -> ItemError:
    return ItemError(f"{INVALID} after {repairs} repair{'s' if repairs != 1 else ''}: {problem}")


def example(schema: Any, text: str, depth: int = 0) -> Any:
    """An offline stand-in's answer (the ``local`` backend): a value that follows ``schema``,
    built from the words of ``text``."""
    if not isinstance(schema, dict) or depth > 20:
        return None
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return example(schema[key][0], text, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    words = text.split()
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {name: example(sub, text, depth + 1) for name, sub in props.items()}
    if kind == "array":
        return [example(schema.get("items") or {}, text, depth + 1)] if schema.get("minItems") else []
    if kind == "integer":
        return max(int(schema.get("minimum", 0)), min(len(words), int(schema.get("maximum", len(words)))))
    if kind == "number":
        return float(schema.get("minimum", len(words)))
    if kind == "boolean":
        return len(words) % 2 == 0
    if kind == "null":
        return None
    return " ".join(words[:5])


class Extracting:
    """Mixed into ``ModelBackend``: ``extract``, over the backend's own call loop (``_call``),
    so every first answer and every repair is gated, reserved, counted and priced like any call."""

    #: What the provider has (``SCHEMA``, ``JSON_MODE`` or ``PROMPT``); a backend whose servers
    #: vary reads LEASH_MODEL_STRUCTURED_OUTPUT in ``structured_mode``.
    structured_output = PROMPT

    @classmethod
    def structured_mode(cls) -> str:
        return cls.structured_output

    @classmethod
    def structured_problem(cls, schema: dict) -> str | None:
        """What the provider's structured mode refuses in ``schema`` (asked at the door), or None."""
        return None

    def _call_shaped(self, messages: list[dict], shape: dict) -> str:
        """One call whose answer must have ``shape`` (the call loop's: ``ModelBackend``)."""
        raise NotImplementedError

    def _repair_attempts(self) -> int:
        """LEASH_REPAIR_ATTEMPTS (the backend's: settings are read there)."""
        raise NotImplementedError

    def extract(self, messages: list[dict], schema: dict, answer: str | None = None, check=None) -> Any:
        """The object the model answers ``messages`` with, following ``schema``; ``answer`` is a
        first answer already received (a batch's), to be checked and repaired. An answer that
        breaks the schema is asked again with the validation error, LEASH_REPAIR_ATTEMPTS times;
        then ItemError (``invalid_error``)."""
        check = check or validator(schema)
        repairs = self._repair_attempts()
        shape = response_format(schema)
        turns = list(messages)
        held = getattr(self, "_held", None)
        if held is not None:
            held.offer = None  # a given answer (a batch's) is not this thread's last call's
        if answer is None:
            answer = self._call_shaped(turns, shape)
        for done in range(repairs + 1):
            value, problem = check_answer(answer, check)
            if problem is None:
                # Only an answer that follows the schema is cached (jobs.models.spending).
                getattr(self, "_accept", lambda: None)()
                return value
            if done == repairs:
                raise invalid_error(problem, repairs)
            turns += repair_turn(answer, problem)
            answer = self._call_shaped(turns, shape)
        raise AssertionError("unreachable")
