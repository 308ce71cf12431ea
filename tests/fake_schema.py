"""What the fake model servers answer to a structured request (``tests.fake_openai.answer_for``):
an object built from the request's JSON Schema, or one that breaks it."""

from __future__ import annotations


def schema_value(schema: dict, item: str):
    """A value that follows ``schema`` (the subset the tests use), from the item's words."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    kind = next((k for k in kind if k != "null"), "null") if isinstance(kind, list) else kind
    if kind == "object":
        return {name: schema_value(sub, item) for name, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [schema_value(schema.get("items") or {"type": "string"}, item)]
    if kind == "integer":
        return len(item.split())
    if kind == "number":
        return len(item) / 10
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return item.split()[-1] if item.split() else item


def broken(schema: dict, value: dict) -> dict:
    """``value`` with its first required property left out (a schema-breaking answer)."""
    value = dict(value)
    required = schema.get("required") or list(schema.get("properties") or {})
    if required:
        value.pop(required[0], None)
    else:
        value["unexpected"] = True
    return value
