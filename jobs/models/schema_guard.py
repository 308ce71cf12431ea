"""A JSON Schema written by a submitter, made safe to check answers against: a worker checks
every answer of an ``extract`` job with it, so nothing in it may hang the worker, reach a
network or a file, or crash the door that accepts it.

- References resolve only inside the schema (``#``, ``#/$defs/x``, ``#anchor``): the door
  refuses any other ``$ref`` (naming it), and the validator's registry refuses to retrieve
  anything, so not even a schema accepted before this check can make a worker fetch a URL.
- Patterns (``pattern``, ``patternProperties``, and the additional and unevaluated properties
  they decide: jobs/models/schema_unevaluated.py) are matched by RE2, which never backtracks:
  its time grows with the text, not exponentially with the pattern. A pattern RE2 cannot compile (a look-ahead, a
  back-reference) is refused at the door.
- ``$ref`` expansion is bounded at the door: following every reference may reach at most
  LEASH_MAX_SCHEMA_EXPANSION subschemas, nest at most ``REF_DEPTH`` references, and a
  reference back to itself must descend into the answer on the way (a list item, a property),
  or checking an answer would never end.
- Checking one answer has a deadline (LEASH_SCHEMA_CHECK_SECONDS), tested at every keyword:
  passing it is the item's error, named, never a worker held until its lease runs out.
"""

from __future__ import annotations

import functools
import time
from contextvars import ContextVar
from typing import Any

import jsonschema
import re2
from jsonschema import validators
from jsonschema.exceptions import ValidationError
from referencing import Registry
from referencing.exceptions import NoSuchResource

from jobs.models.schema_unevaluated import unevaluated_properties

#: References nested in references (a chain of ``$defs``), at most: each costs stack frames
#: in the validator, whose recursion ends at Python's limit.
REF_DEPTH = 32
#: Keywords whose subschemas apply to a part of the answer (a property, an item): a reference
#: that loops back through one of them ends when the answer does.
DESCENDING = frozenset({"properties", "patternProperties", "additionalProperties", "unevaluatedProperties",
                        "items", "prefixItems", "additionalItems", "unevaluatedItems", "contains",
                        "propertyNames"})
#: Keywords whose values are data, not subschemas (a "pattern" inside them is no pattern).
DATA = frozenset({"enum", "const", "default", "examples", "required", "type", "description", "title", "$comment"})
#: Keywords holding subschemas by name.
NAMED = frozenset({"properties", "patternProperties", "dependentSchemas", "$defs", "definitions"})
REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is the submitter's 422, not a line in the server's log
_OPTIONS.max_mem = 8 << 20


@functools.lru_cache(maxsize=512)
def compile_pattern(pattern: str):
    """The pattern compiled by RE2 (re2.error when it cannot be)."""
    return re2.compile(pattern, _OPTIONS)


def _search(pattern: str, text: str) -> bool:
    return compile_pattern(pattern).search(text) is not None


def pattern_problem(pattern: Any) -> str | None:
    if not isinstance(pattern, str):
        return None  # the metaschema names a pattern that is no string
    try:
        compile_pattern(pattern)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        return f"pattern {_quote(pattern)} is refused: RE2, which never backtracks, cannot compile it ({reason})"
    return None


def _quote(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


# --- the door ----------------------------------------------------------------------------------
def _subschemas(node: dict):
    """(keyword, subschema) for every subschema ``node`` applies (not its ``$defs``)."""
    for key, value in node.items():
        if key in DATA or key in ("$defs", "definitions"):
            continue
        if key in NAMED and isinstance(value, dict):
            yield from ((key, sub) for sub in value.values())
        elif isinstance(value, list) and key not in REFERENCES:
            yield from ((key, sub) for sub in value)
        elif isinstance(value, dict | bool):
            yield key, value


def _walk(schema: dict):
    """(pointer, node) for every subschema, $defs included, without recursion."""
    pending: list[tuple[str, Any]] = [("", schema)]
    while pending:
        pointer, node = pending.pop()
        if not isinstance(node, dict):
            continue
        yield pointer, node
        for key, value in node.items():
            if key in DATA:
                continue
            if key in NAMED and isinstance(value, dict):
                pending.extend((f"{pointer}/{key}/{_escape(name)}", sub) for name, sub in value.items())
            elif isinstance(value, list):
                pending.extend((f"{pointer}/{key}/{i}", sub) for i, sub in enumerate(value))
            elif isinstance(value, dict):
                pending.append((f"{pointer}/{key}", value))


def _escape(name: str) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")


def _anchors(schema: dict) -> dict[str, dict]:
    found = {}
    for _, node in _walk(schema):
        for key in ("$anchor", "$dynamicAnchor", "$recursiveAnchor"):
            if isinstance(node.get(key), str):
                found[node[key]] = node
        if isinstance(node.get("$id"), str) and node["$id"].startswith("#"):
            found[node["$id"][1:]] = node  # draft 6/7: an anchor spelled as an $id
    return found


def _resolve(schema: dict, ref: str, anchors: dict[str, dict]) -> Any:
    """The node ``ref`` (a ``#...`` reference) names in ``schema``, or KeyError."""
    from urllib.parse import unquote

    fragment = unquote(ref[1:])
    if not fragment:
        return schema
    if not fragment.startswith("/"):
        return anchors[fragment]
    node: Any = schema
    for part in fragment[1:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KeyError(ref)
    return node


def door_problem(schema: dict, max_expansion: int) -> str | None:
    """Why checking answers against ``schema`` could hurt a worker (a reference outside the
    schema, a pattern RE2 cannot compile, a reference expansion past the bounds), or None."""
    for pointer, node in _walk(schema):
        where = f" (at {pointer or '/'})"
        for key in REFERENCES:
            ref = node.get(key)
            if isinstance(ref, str) and not ref.startswith("#"):
                return (f"{key} {_quote(ref)}{where} points outside the schema: only references inside it "
                        '("#/$defs/name") are followed, never a URL or a file')
        # The root's $id only names the schema; one further in would start a document of its own.
        if pointer and isinstance(node.get("$id"), str) and not node["$id"].startswith("#"):
            return (f"$id {_quote(node['$id'])}{where}: a schema's parts cannot name other documents "
                    "(references resolve only inside the schema)")
        problem = pattern_problem(node.get("pattern"))
        if problem:
            return problem + where
        if isinstance(node.get("patternProperties"), dict):
            for name in node["patternProperties"]:
                problem = pattern_problem(name)
                if problem:
                    return f"patternProperties: {problem}{where}"
    return _expansion_problem(schema, max_expansion)


def _expansion_problem(schema: dict, limit: int) -> str | None:
    """Follows every reference as the validator would, counting the subschemas reached."""
    anchors = _anchors(schema)
    # (node, chain): chain holds the references being followed, each with whether the way
    # since it went into a part of the answer.
    pending: list[tuple[Any, tuple[tuple[str, bool], ...]]] = [(schema, ())]
    reached = 0
    while pending:
        node, chain = pending.pop()
        if not isinstance(node, dict):
            continue
        reached += 1
        if reached > limit:
            return (f"reaches more than {limit} subschemas once its $refs are followed (LEASH_MAX_SCHEMA_EXPANSION): "
                    "checking each answer would take too long")
        for key, sub in _subschemas(node):
            if key in REFERENCES:
                continue
            pending.append((sub, tuple((ref, True) for ref, _ in chain) if key in DESCENDING else chain))
        for key in REFERENCES:
            ref = node.get(key)
            if not isinstance(ref, str):
                continue
            try:
                target = _resolve(schema, ref, anchors)
            except KeyError:
                return f"{key} {_quote(ref)} names nothing in the schema"
            looped = [descended for seen, descended in chain if seen == ref]
            if looped:
                if not looped[-1]:
                    return (f"{key} {_quote(ref)} refers back to itself without going into a part of the answer: "
                            "checking an answer would never end")
                continue  # recursion over the answer's parts: it ends where the answer does
            if len(chain) >= REF_DEPTH:
                return f"nests $refs more than {REF_DEPTH} deep"
            pending.append((target, chain + ((ref, False),)))
    return None


# --- the worker --------------------------------------------------------------------------------
def _refuse(uri: str):
    raise NoSuchResource(ref=uri)


#: Resolves nothing but the schema itself (and the drafts' own metaschemas, shipped offline).
REGISTRY = Registry(retrieve=_refuse)
_deadline: ContextVar[float | None] = ContextVar("leash_schema_deadline", default=None)


def _timed(keyword):
    """``keyword`` behind the deadline of the answer being checked."""
    def check(validator, value, instance, schema):
        deadline = _deadline.get()
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError("checking the answer against the schema took too long")
        return keyword(validator, value, instance, schema)
    return check


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator, patterns, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional(instance: dict, schema: dict) -> list:
    properties = schema.get("properties") or {}
    patterns = list(schema.get("patternProperties") or {})
    return [key for key in instance if key not in properties and not any(_search(p, key) for p in patterns)]


def _additional_properties(validator, additional, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    extras = _additional(instance, schema)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            listed = ", ".join(map(repr, sorted(extras)))
            yield ValidationError(f"{listed} {verb} not match any of the regexes: "
                                  + ", ".join(map(repr, sorted(schema["patternProperties"]))))
        else:
            listed = ", ".join(map(repr, extras))
            yield ValidationError(f"Additional properties are not allowed ({listed} "
                                  f"{'was' if len(extras) == 1 else 'were'} unexpected)")


@functools.lru_cache(maxsize=16)
def _safe_class(base):
    """``base`` (a draft's validator) with RE2 patterns, and every keyword behind the deadline."""
    keywords = dict(base.VALIDATORS)
    if "unevaluatedProperties" in keywords:  # draft 2019-09 decides what was evaluated its own way
        legacy = keywords["unevaluatedProperties"].__name__.endswith("_draft2019")
        keywords["unevaluatedProperties"] = unevaluated_properties(_search, legacy)
    for name, fn in (("pattern", _pattern), ("patternProperties", _pattern_properties),
                     ("additionalProperties", _additional_properties)):
        if name in keywords:
            keywords[name] = fn
    return validators.extend(base, {name: _timed(fn) for name, fn in keywords.items()})


def safe_validator(schema: dict):
    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return _safe_class(base)(schema, registry=REGISTRY)


def iter_errors(check, value: Any, seconds: float) -> list:
    """``check``'s errors about ``value``, all found before ``seconds`` pass, else TimeoutError
    (the caller makes it, and whatever else the check raises, the item's error)."""
    token = _deadline.set(time.monotonic() + seconds)
    try:
        return list(check.iter_errors(value))
    finally:
        _deadline.reset(token)


def regex_format_checker():
    """The metaschema's ``"format": "regex"`` checked by RE2 (Python's ``re`` recurses on a
    deeply nested pattern until it crashes)."""
    checker = jsonschema.FormatChecker()
    checker.checkers = dict(checker.checkers)
    checker.checkers["regex"] = (lambda text: not isinstance(text, str) or pattern_problem(text) is None, ())
    return checker
