"""Job kinds: a name, the payload fields it takes, a validator run before anything is
written, and the function.

A kind declares its fields once (``Field``: name, label, help, check); the API's validation,
the submission form, ``leash submit``'s options and the job page's "submitted with" rows are
all derived from the declarations. To add a kind::

    TONE = Field("tone", "Tone", "How the summary should sound, e.g. formal", check=check_tone)

    @kind("summarise", fields=(TONE,))
    def summarise(ctx: JobContext, payload: dict) -> dict: ...

A kind whose payload is not items plus declared fields writes its own validator::

    @summarise.validator
    def _(payload: dict) -> int:  # returns the number of items (total)
        ...
"""

from __future__ import annotations

import importlib
import os
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from jobs import config
from jobs.core.running import chunk_tree
from jobs.errors import InvalidJob, ItemError, NeedsDirect, PermanentError
from jobs.intake import modes
from jobs.intake.limits import (  # check_fields: for kinds that write their own validator
    check_extract_template,
    check_fields,
    check_instruction,
    check_items,
    check_labels,
    check_max_invalid,
    check_max_item_errors,
    check_schema,
    check_template,
    schema_from_text,
    validate_concurrency,
)
from jobs.intake.modes import BatchSpec
from jobs.models import backends, structured
from jobs.models.prompts import CLASSIFY_MAX_TOKENS, classify_messages, match_label
from jobs.models.provider import CallRequest, estimate_text_tokens

if TYPE_CHECKING:
    from jobs.core.running.context import JobContext

# The defaults of LEASH_MAX_ITEMS, LEASH_MAX_ITEM_CHARS and LEASH_MAX_TEMPLATE_CHARS;
# config.limits() has the values in force.
MAX_ITEMS = 1000
MAX_ITEM_CHARS = 10_000
MAX_TEMPLATE_CHARS = 20_000


@dataclass(frozen=True)
class Field:
    """One payload field a kind takes, declared once."""

    name: str  # the payload's key, the form's field, the CLI's --option
    label: str  # the form's label and the job page's row
    help: str  # the form's hint and the option's --help
    check: Callable[[dict], Any]  # raises InvalidJob naming the field (jobs/intake/limits.py)
    from_text: Callable[[str], Any] = str.strip  # what a form box or an option holds -> the value
    multiline: bool = False  # a text area in the form
    placeholder: str = ""
    #: What the CLI says when the field is missing (a person typed no --option, not a JSON key).
    missing: str = ""
    #: The CLI's option names a file holding the text (the form takes it pasted or uploaded).
    from_file: bool = False


def comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


@dataclass
class Kind:
    name: str
    func: Callable[[JobContext, dict], dict]
    fields: tuple[Field, ...] = ()
    validate: Callable[[dict], int] | None = None
    #: How its items go through a provider's batch API (payload ``mode: "batch"``); None: it cannot.
    batch: BatchSpec | None = None
    #: Item errors a job of this kind may end with when neither the job (``max_item_errors``) nor
    #: LEASH_MAX_ITEM_ERRORS says (None: any but all; jobs/core/outcome.py).
    max_item_errors: int | None = None
    #: One answer of all its items together (reduce), not a result per item at the item's index:
    #: an item it cannot take fails the job rather than becoming that item's error (jobs.runner).
    one_answer: bool = False

    def __post_init__(self):
        if self.validate is None:  # a kind with neither fields nor a validator checks nothing
            self.validate = self._validate_declared if self.fields else (lambda payload: 0)

    def validator(self, fn: Callable[[dict], int]) -> Callable[[dict], int]:
        self.validate = fn
        return fn

    def _validate_declared(self, payload: dict) -> int:
        """Items plus the declared fields: each field's check, the items, then nothing else
        (after the required ones, so a missing field is named before an unknown one)."""
        for field in self.fields:
            field.check(payload)
        total = len(validate_items(payload))
        check_fields(payload, ("items", *(f.name for f in self.fields)))
        return total


KINDS: dict[str, Kind] = {}


def kind(name: str, fields: tuple[Field, ...] = ()) -> Callable[[Callable], Kind]:
    def register(func: Callable[[JobContext, dict], dict]) -> Kind:
        KINDS[name] = Kind(name, func, tuple(fields))
        return KINDS[name]

    return register


def fields() -> list[tuple[Field, list[str]]]:
    """Every declared field once, with the kinds that take it (the form's and the CLI's)."""
    found: dict[str, tuple[Field, list[str]]] = {}
    for name in sorted(KINDS):
        for field in KINDS[name].fields:
            found.setdefault(field.name, (field, []))[1].append(name)
    return list(found.values())


_env_imported = False


def import_from_env() -> None:
    """Import LEASH_IMPORTS's modules once per process (a kind or field they declare is then
    known to whoever asks: the CLI's options, a submission's check)."""
    global _env_imported
    if not _env_imported:
        _env_imported = True
        import_kinds()


def import_kinds(modules: list[str] | tuple[str, ...] | None = None) -> None:
    """Import the modules that register job kinds (``--import`` / ``LEASH_IMPORTS``), found
    from the current directory too, as ``rq worker`` finds them: ``leash worker --import
    myapp.kinds`` run beside ``myapp/`` works without installing it."""
    if modules is None:
        modules = [config.settings().imports]
    if any(name.strip() for spec in modules for name in spec.split(",")) and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # last: a module of the current directory never shadows an installed one
    for spec in modules:
        for name in spec.split(","):
            if name.strip():
                importlib.import_module(name.strip())


def get(name: str) -> Kind:
    if name not in KINDS:
        import_from_env()
    try:
        return KINDS[name]
    except KeyError:
        raise InvalidJob(f"unknown kind {name!r}; known kinds: {', '.join(sorted(KINDS))}") from None


def validate_items(payload: dict, max_items: int | None = None, max_chars: int | None = None) -> list[str]:
    """``payload["items"]``: a non-empty list of strings within LEASH_MAX_ITEMS and
    LEASH_MAX_ITEM_CHARS (or the limits given); raises InvalidJob saying which limit."""
    validate_concurrency(payload)
    check_max_item_errors(payload)
    return check_items(payload, max_items, max_chars)


def _item_or_error(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """An item the model cannot answer is stored as {"error": ...}; the job goes on."""

    def run(item: str) -> Any:
        try:
            return fn(item)
        except ItemError as exc:
            return {"error": str(exc)}

    return run


def _is_error(result: Any) -> bool:
    return isinstance(result, dict) and "error" in result


def _run_items(ctx: JobContext, payload: dict, one: Callable[[Any], Any]) -> list[Any]:
    """Each item through ``one`` (direct), or, in batch mode, through the provider's batch API
    with ``one`` for the items the batch does not answer."""
    if modes.mode_of(payload) == "batch":
        return ctx.through_batch(get(ctx.attempt.kind).batch, one)
    return ctx.for_each(payload["items"], one)


LABELS = Field("labels", "Labels", "Comma-separated, e.g. positive, negative, neutral; each item gets one of them",
               check=check_labels, from_text=comma_list, placeholder="positive, negative, neutral",
               missing="give the labels to choose from: --labels positive,negative (classify picks one per item)")
TEMPLATE = Field("template", "Template", "Your instruction, with {item} where each item goes; each item's answer is "
                 "its result", check=check_template, multiline=True, placeholder="Summarise in one line: {item}",
                 missing="give the prompt: --template 'Summarise: {item}' ({item} is where each item goes)")


MAX_ITEM_ERRORS = Field("max_item_errors", "Item errors allowed",
                        "How many items may end in an error (they keep it) and the job still succeed: a count (3) or "
                        "a share (10%); default: any but all (extract: 0), or LEASH_MAX_ITEM_ERRORS",
                        check=check_max_item_errors, from_text=lambda text: int(text) if text.strip().isdigit()
                        else (text.strip() or None), placeholder="3 or 10%")


@kind("classify", fields=(LABELS, MAX_ITEM_ERRORS))
def classify(ctx: JobContext, payload: dict) -> dict[str, Any]:
    """One label per item, from the configured backend; an answer outside the labels (after
    one correction) becomes that item's error."""
    backend = ctx.model
    labels = payload["labels"]
    results = _run_items(ctx, payload, _item_or_error(lambda text: backend.classify(text, labels)))
    answered = [r for r in results if not _is_error(r)]
    return {"items": len(results), "labels": dict(Counter(answered)), "errors": len(results) - len(answered)}


def _classify_label(payload: dict, item: str, text: str) -> str:
    label = match_label(text, payload["labels"])
    if label is None:
        raise NeedsDirect()  # asked directly, where the correction round runs
    return label


classify.batch = BatchSpec(
    request=lambda payload, item, max_tokens: CallRequest(
        classify_messages(item, payload["labels"]), min(CLASSIFY_MAX_TOKENS, max_tokens), truncation_ok=True),
    read=_classify_label)


@kind("prompt", fields=(TEMPLATE, MAX_ITEM_ERRORS))
def prompt(ctx: JobContext, payload: dict) -> dict[str, Any]:
    """The template, with ``{item}`` replaced by each item, sent to the configured backend;
    each completion is stored as that item's result."""
    backend = ctx.model
    template = payload["template"]
    # str.replace, not str.format: braces elsewhere in a template (JSON examples) are text.
    complete = _item_or_error(lambda item: backend.complete(template.replace("{item}", item)))
    results = _run_items(ctx, payload, complete)
    answered = [r for r in results if not _is_error(r)]
    return {"items": len(results), "errors": len(results) - len(answered),
            "characters": sum(len(r) for r in answered)}


prompt.batch = BatchSpec(
    request=lambda payload, item, max_tokens: CallRequest(
        [{"role": "user", "content": payload["template"].replace("{item}", item)}], max_tokens),
    read=lambda payload, item, text: text)


SCHEMA = Field("schema", "Schema", "A JSON Schema of an object: each item's answer follows it, and its top-level "
               "properties are the result's columns", check=check_schema, from_text=schema_from_text,
               multiline=True, from_file=True,
               placeholder='{"type": "object", "properties": {"product": {"type": "string"}}, "required": ["product"], '
                           '"additionalProperties": false}',
               missing="give the JSON Schema each answer follows: --schema schema.json")


#: The template once more, optional for extract (the form and the CLI show one box, one option).
EXTRACT_TEMPLATE = replace(TEMPLATE, check=check_extract_template,
                           help="Your instruction, with {item} where each item goes (prompt: each item's answer is "
                                "its result; extract: optional, a default instruction otherwise)")


@kind("extract", fields=(SCHEMA, EXTRACT_TEMPLATE, MAX_ITEM_ERRORS))
def extract(ctx: JobContext, payload: dict) -> dict[str, Any]:
    """Each item's answer as an object that follows ``payload["schema"]`` (provider-native
    structured output where the backend has it; every answer validated, an invalid one asked
    again with the validation error: jobs.models.structured). An item without a valid answer
    keeps its error; more of them than ``max_item_errors`` (``max_invalid``, its older name;
    default 0) fail the job (jobs.runner)."""
    backend = ctx.model
    schema = payload["schema"]
    check = structured.validator(schema)
    mode = backend.structured_mode() if hasattr(backend, "structured_mode") else structured.SCHEMA
    results = _run_items(ctx, payload, _item_or_error(
        lambda item: backend.extract(_extract_messages(payload, item, mode), schema, check=check)))
    invalid = [r for r in results if _is_error(r)]
    return {"items": len(results), "valid": len(results) - len(invalid), "invalid": len(invalid)}


@extract.validator
def _(payload: dict) -> int:
    problem = backends.structured_problem(check_schema(payload))  # what the provider's strict mode refuses
    if problem:
        raise InvalidJob(f"'schema': {problem}")
    check_extract_template(payload)
    check_max_invalid(payload)
    check_max_item_errors(payload)
    total = len(validate_items(payload))
    check_fields(payload, ("items", "schema", "template", "max_item_errors", "max_invalid"))
    return total


extract.max_item_errors = 0  # an answer that breaks the schema is what extract is for: none by default


def _extract_messages(payload: dict, item: str, mode: str) -> list[dict]:
    template = payload.get("template") or structured.DEFAULT_TEMPLATE
    return structured.messages(template, item, payload["schema"], mode)


def _extract_read(payload: dict, item: str, text: str) -> Any:
    """A batch's answer: the object when it follows the schema, else asked again directly,
    with the validation error (``_extract_repair``)."""
    value, problem = structured.check_answer(text, structured.validator(payload["schema"]))
    if problem is not None:
        raise NeedsDirect(text)
    return value


def _extract_repair(backend, payload: dict, item: str, answer: str) -> Any:
    """An item whose batch answer broke the schema: repaired by direct calls that carry it."""
    mode = backend.structured_mode() if hasattr(backend, "structured_mode") else structured.SCHEMA
    try:
        return backend.extract(_extract_messages(payload, item, mode), payload["schema"], answer=answer)
    except ItemError as exc:
        return {"error": str(exc)}


def _extract_request(payload: dict, item: str, max_tokens: int) -> CallRequest:
    # A batch's requests are built before the backend is: the mode is the configured one.
    mode = getattr(backends.backend_class(), "structured_mode", lambda: structured.SCHEMA)()
    return CallRequest(_extract_messages(payload, item, mode), max_tokens,
                       response_format=structured.response_format(payload["schema"]))


extract.batch = BatchSpec(request=_extract_request, read=_extract_read, repair=_extract_repair)


INSTRUCTION = Field("instruction", "Instruction", "What to make of all the items together, e.g. Summarise the "
                    "complaints; the job's one result is the answer", check=check_instruction, multiline=True,
                    placeholder="Summarise the complaints in five points",
                    missing="give the instruction: --instruction 'Summarise the complaints' (reduce answers it once, "
                            "for all the items together)")


@kind("reduce", fields=(INSTRUCTION,))
def reduce(ctx: JobContext, payload: dict) -> dict[str, Any]:
    """One answer to ``payload["instruction"]`` over all the items: in one call when they fit
    LEASH_REDUCE_CHUNK_TOKENS, else map-reduce in chunks, each call checkpointed
    (jobs/core/running/chunk_tree.py). The job's one result (index 0) is the answer; a job
    whose ``items_from`` chose no items makes no call and has none."""
    backend = ctx.model
    instruction = payload["instruction"]

    def ask(texts: list[str], partial: bool) -> str:
        try:
            return backend.reduce(instruction, texts, partial=partial)
        except ItemError as exc:  # every text is in the answer: without one, no answer
            raise PermanentError(f"a reduce call got no usable answer ({len(texts)} texts): {exc}") from None

    answer = chunk_tree.run(ctx, payload["items"], ask, config.settings().reduce_chunk_tokens, estimate_text_tokens)
    return {"items": len(payload["items"]), "characters": len(answer or "")}


reduce.one_answer = True  # its results are the answer (index 0) and partials, not one per item
