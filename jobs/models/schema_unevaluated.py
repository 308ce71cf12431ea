"""``unevaluatedProperties`` with the patterns of ``patternProperties`` matched by RE2.

jsonschema decides which properties were evaluated (``find_evaluated_property_keys_by_schema``)
with Python's ``re``, whose backtracking a pattern such as ``^(a+)+$`` turns exponential in the
length of a property name: one answer could hold a worker inside a single ``re.search``, where no
deadline is tested. These are jsonschema 4.26's own keywords (draft 2020-12, and draft 2019-09's
older form) with one change: a pattern is matched by the ``search`` they are given (RE2, in
jobs/models/schema_guard.py). Everything else they do is jsonschema's.
"""

from __future__ import annotations

from collections.abc import Callable

from jsonschema._utils import extras_msg
from jsonschema.exceptions import ValidationError
from referencing.jsonschema import lookup_recursive_ref

Search = Callable[[str, str], bool]


def _is_valid(errors) -> bool:
    return next(errors, None) is None


def _followed(validator, reference: str, recursive: bool = False):
    resolved = lookup_recursive_ref(validator._resolver) if recursive else validator._resolver.lookup(reference)
    return validator.evolve(schema=resolved.contents, _resolver=resolved.resolver), resolved.contents


def _evaluated(validator, instance: dict, schema, search: Search, legacy: bool) -> list:
    """The keys of ``instance`` that ``schema`` evaluates (draft 2020-12, or 2019-09 when ``legacy``)."""
    if validator.is_type(schema, "boolean"):
        return []
    keys: list = []
    refs = [("$ref", False), ("$recursiveRef" if legacy else "$dynamicRef", legacy)]
    for keyword, recursive in refs:
        reference = schema.get(keyword)
        if reference is not None:
            followed, contents = _followed(validator, reference, recursive)
            keys += _evaluated(followed, instance, contents, search, legacy)

    if legacy:
        for keyword in ("properties", "additionalProperties", "unevaluatedProperties"):
            value = schema.get(keyword)
            if validator.is_type(value, "boolean") and value:
                keys += instance.keys()
            elif validator.is_type(value, "object"):
                keys += [name for name in value if name in instance]
    else:
        properties = schema.get("properties")
        if validator.is_type(properties, "object"):
            keys += properties.keys() & instance.keys()
        for keyword in ("additionalProperties", "unevaluatedProperties"):
            subschema = schema.get(keyword)
            if subschema is not None:
                keys += [key for key, value in instance.items() if _is_valid(validator.descend(value, subschema))]

    for pattern in schema.get("patternProperties") or {}:
        keys += [name for name in instance if search(pattern, name)]

    for name, subschema in (schema.get("dependentSchemas") or {}).items():
        if name in instance:
            keys += _evaluated(validator, instance, subschema, search, legacy)

    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword, []):
            if _is_valid(validator.descend(instance, subschema)):
                keys += _evaluated(validator, instance, subschema, search, legacy)

    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys += _evaluated(validator, instance, schema["if"], search, legacy)
            if "then" in schema:
                keys += _evaluated(validator, instance, schema["then"], search, legacy)
        elif "else" in schema:
            keys += _evaluated(validator, instance, schema["else"], search, legacy)
    return keys


def unevaluated_properties(search: Search, legacy: bool = False):
    """The ``unevaluatedProperties`` keyword, its patterns matched by ``search``."""
    def keyword(validator, unevaluated, instance, schema):
        if not validator.is_type(instance, "object"):
            return
        evaluated = _evaluated(validator, instance, schema, search, legacy)
        failing = [name for name in instance if name not in evaluated
                   and not _is_valid(validator.descend(instance[name], unevaluated, path=name, schema_path=name))]
        if not failing:
            return
        if unevaluated is False:
            listed, verb = extras_msg(sorted(failing, key=str))
            yield ValidationError(f"Unevaluated properties are not allowed ({listed} {verb} unexpected)")
        else:
            listed, verb = extras_msg(failing)
            yield ValidationError(f"Unevaluated properties are not valid under the given schema "
                                  f"({listed} {verb} unevaluated and invalid)")
    return keyword
