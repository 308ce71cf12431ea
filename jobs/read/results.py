"""A job's per-item results, read one page at a time.

Results live in the hash ``leash:items:<id>`` (item index -> JSON), written by each
checkpoint. A finished job can hold a thousand of them; a page needs twenty. So a page is an
HMGET of exactly its index range, sent in the same round trip as the few job fields that say
whose job it is and how many items it has — never an HGETALL of everything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from redis import Redis
from rq.exceptions import DeserializationError, NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.archive import reading
from jobs.core import payload_copy
from jobs.core.text import decoded, printable
from jobs.errors import NoSuchJob
from jobs.read.selection import chosen
from jobs.read.selection import taken as selection_taken

#: The largest page a caller may ask for.
MAX_PAGE = 500


@dataclass
class Page:
    job_id: str
    owner: str
    state: str
    done: int
    total: int
    offset: int
    limit: int
    #: (index, result) for the items of the range that have a result, in index order.
    items: list[tuple[int, Any]] = field(default_factory=list)
    #: index -> {calls, input_tokens, output_tokens}: what each stored item's model calls used.
    usage: dict[int, dict[str, int]] = field(default_factory=dict)
    kind: str | None = None
    #: Read from the archive: Redis no longer holds the job's record (jobs/read/job_status.py).
    from_archive: bool = False

    @property
    def next_offset(self) -> int | None:
        following = self.offset + self.limit
        return following if following < self.total else None

    @property
    def previous_offset(self) -> int | None:
        return max(0, self.offset - self.limit) if self.offset > 0 else None


def read_page(connection: Redis, job_id: str, offset: int = 0, limit: int = 50) -> Page:
    """One page of results, in one round trip; from the archive (its row, then the page's rows)
    when Redis no longer holds the job's record. Raises ``NoSuchJob`` for an unknown id."""
    if offset < 0 or not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"need offset >= 0 and 1 <= limit <= {MAX_PAGE}")
    indexes = list(range(offset, offset + limit))
    with connection.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.job(job_id), "owner", "state", "done", "total", "archived_at", "kind")
        pipe.hmget(keys.items(job_id), indexes)
        pipe.hmget(keys.usage(job_id), [f"i{index}" for index in indexes])
        pipe.exists(keys.items(job_id))
        (owner, state, done, total, archived, kind), values, usages, held = pipe.execute()
    if owner is None:
        return _archived_page(connection, job_id, offset, limit)
    return page_of(connection, job_id, offset, limit, owner, state, done, total, archived, values, usages, held,
                   kind=decoded(kind))


def _archived_page(connection: Redis, job_id: str, offset: int, limit: int) -> Page:
    found = reading.ended_job(job_id, connection)
    if found is None:
        raise NoSuchJob(f"no such job: {job_id}")
    return archived_page(connection, found, offset, limit)


def archived_page(connection: Redis, found: reading.EndedJob, offset: int, limit: int,
                  rows: list | None = None) -> Page:
    """The page of a job Redis no longer holds, from its archived record and ``rows`` (the
    archive's rows of the page, ``reading.page``: read here when not given)."""
    h = found.record
    page = page_of(connection, found.job_id, offset, limit, found.owner, h.get("state"), h.get("done"), h.get("total"),
                   True, [None] * limit, [None] * limit, False, kind=h.get("kind"), rows=rows)
    page.from_archive = True
    return page


#: The kind whose job has one result, its answer at index 0, whatever its items
#: (jobs/core/running/chunk_tree.py): its results are that one row.
ONE_ANSWER_KIND = "reduce"


def page_of(connection: Redis, job_id: str, offset: int, limit: int, owner, state, done, total, archived,
            values: list, usages: list, held, kind: str | None = None, rows: list | None = None) -> Page:
    """The page from what a read of its job fields (owner, state, done, total, archived_at), its
    range of the items and usage hashes and whether the items hash exists returned (the job
    page reads them with everything else it shows: jobs/read/job_page.py). A ``reduce`` job's
    results are one: its answer (done 1 of 1 once it has it; its progress in calls is its status).
    ``rows``: the archive's rows of the range, when the caller read them already."""
    indexes = list(range(offset, offset + limit))
    if kind == ONE_ANSWER_KIND:
        total = 1
    if archived and not held:  # archived, and Redis' copy of its items has left: the archive's
        if rows is None:
            rows = reading.page(job_id, offset, limit, connection)
        values = [None] * limit
        usages = [None] * limit
        for index, _, result, usage in rows:
            values[index - offset], usages[index - offset] = result, usage
    items = [(index, json.loads(value)) for index, value in zip(indexes, values, strict=True) if value is not None]
    if kind == ONE_ANSWER_KIND:
        done = 1 if any(index == 0 for index, _ in items) else 0
    return Page(job_id=job_id, owner=decoded(owner), state=decoded(state) or "queued", done=int(done or 0),
                total=int(total or 0), offset=offset, limit=limit, items=items,
                usage={index: parse_item_usage(raw) for index, raw in zip(indexes, usages, strict=True) if raw},
                kind=kind)


USAGE_COLUMNS = ("calls", "input_tokens", "output_tokens", "cache_hits")


def parse_item_usage(raw: bytes | str) -> dict[str, int]:
    """An item's usage as heartbeat_v4 stores it: "calls,input,output,hits" (the release before
    stored no hits: 0)."""
    figures = [int(n) for n in decoded(raw).split(",")]
    return dict(zip(USAGE_COLUMNS, figures + [0] * (len(USAGE_COLUMNS) - len(figures)), strict=True))


def item_inputs(connection: Redis, job_id: str, offset: int, limit: int) -> list[Any]:
    """The submitted items ``[offset, offset + limit)``, for showing inputs beside results (of an
    archived job whose copy left Redis, that page only, read from the archive)."""
    if _from_archive(connection, job_id):
        return [item for _, item, _, _ in reading.page(job_id, offset, limit, connection)]
    return submitted_items(connection, job_id)[offset:offset + limit]


def _from_archive(connection: Redis, job_id: str) -> bool:
    """The job was archived and its payload copy and RQ's record have left Redis (or Redis no
    longer holds its record at all)."""
    with connection.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.job(job_id), "archived_at", "owner")
        pipe.exists(keys.payload(job_id), keys.rq_job(job_id))
        (archived, owner), held = pipe.execute()
    return (archived is not None or owner is None) and not held


def _archive_may_hold(connection: Redis, job_id: str) -> bool:
    """The job was archived, or Redis no longer holds its record (the archive may): one command."""
    archived, owner = connection.hmget(keys.job(job_id), "archived_at", "owner")
    return archived is not None or owner is None


def submitted_items(connection: Redis, job_id: str) -> list[Any]:
    """Every submitted item: leash's copy of the payload, the one a succeeded job keeps (RQ's
    record of it holds a stub), else RQ's job (a job from a release that kept no copy). Empty
    when neither has the job or its payload has no items."""
    raw = connection.get(keys.payload(job_id))
    if raw is not None:
        try:
            items = payload_copy.decode(raw).get("items")
        except (ValueError, AttributeError):
            items = None
        if isinstance(items, list):
            return items
    try:
        job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
        _, payload = job.args
    except (NoSuchJobError, DeserializationError, ValueError, TypeError):
        payload = reading.payload(job_id, connection) if _archive_may_hold(connection, job_id) else None
    items = payload.get("items") if isinstance(payload, dict) else None
    return items if isinstance(items, list) else []


def iter_results(connection: Redis, job_id: str, page_size: int = MAX_PAGE):
    """(index, item, result or None, usage or None) for every item, page by page: a job of
    any size is streamed, never held whole. Raises ``NoSuchJob`` for an unknown id."""
    first = read_page(connection, job_id, 0, page_size)
    if first.kind == ONE_ANSWER_KIND:  # one row: the instruction, the answer
        yield 0, printable(answer_item(connection, job_id)), printable(dict(first.items).get(0)), first.usage.get(0)
        return
    if first.from_archive or _from_archive(connection, job_id):  # its inputs too, a page per query
        yield from _iter_archived(connection, job_id, first.total, page_size)
        return
    inputs = submitted_items(connection, job_id)
    total = max(first.total, len(inputs))
    page: Page | None = first
    offset = 0
    while offset < total:
        if page is None:
            page = read_page(connection, job_id, offset, page_size)
        found = dict(page.items)
        for index in range(offset, min(offset + page_size, total)):
            # Stored text may hold what no UTF-8 output can write (jobs/core/text.py).
            item = printable(inputs[index]) if index < len(inputs) else None
            yield index, item, printable(found.get(index)), page.usage.get(index)
        offset += page_size
        page = None


def answer_item(connection: Redis, job_id: str) -> str | None:
    """What a ``reduce`` job's one row shows as its item: the instruction it answered."""
    payload = stored_payload(connection, job_id)
    instruction = payload.get("instruction") if isinstance(payload, dict) else None
    return instruction if isinstance(instruction, str) else None


def _iter_archived(connection: Redis, job_id: str, total: int, page_size: int):
    offset = 0
    while True:
        rows = reading.page(job_id, offset, page_size, connection)
        if not rows and offset >= total:
            return
        found = {index: (item, result, usage) for index, item, result, usage in rows}
        last = max(found, default=offset - 1)
        for index in range(offset, max(min(offset + page_size, total), last + 1)):
            item, result, usage = found.get(index, (None, None, None))
            yield (index, printable(item), printable(None if result is None else json.loads(result)),
                   None if not usage else parse_item_usage(usage))
        offset += page_size


#: What a spreadsheet reads as the start of a formula (OWASP's list for CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_cell(text: str | None) -> str:
    """A CSV cell a spreadsheet shows as text. Items come from users and results from a model, so
    a cell such as `=HYPERLINK(...)` or `@SUM(...)` would run as a formula when the download is
    opened: such a cell gets a leading `'` (OWASP's advice), so the spreadsheet shows it as text. A
    plain number ("-3.5") is left alone; the JSON-lines download is never altered."""
    if not text:
        return ""
    if text.startswith(FORMULA_STARTS):
        try:
            float(text)
        except ValueError:
            return "'" + text
    return text


#: The CSV download's header (web and CLI) for results that are text or one value.
CSV_HEADER = ["index", "item", "result", *USAGE_COLUMNS]
#: The column of an item's error when results are objects (one column per property).
ERROR_COLUMN = "error"


def result_columns(connection: Redis, job_id: str) -> list[str]:
    """The properties results are shown in, one column each: the top-level properties of an
    ``extract`` job's schema, in its order; [] for a job whose results are text or one value."""
    return schema_columns(job_schema(connection, job_id))


def schema_columns(schema: dict | None) -> list[str]:
    """``result_columns`` of a schema already read."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    return [str(name) for name in props] if isinstance(props, dict) else []


def job_schema(connection: Redis, job_id: str) -> dict | None:
    """The JSON Schema an ``extract`` job was submitted with (from its payload copy, or the
    archive's once that copy has left Redis); None for a job without one."""
    return payload_schema(stored_payload(connection, job_id))


def payload_schema(payload: Any) -> dict | None:
    """``job_schema`` of a payload already read."""
    schema = payload.get("schema") if isinstance(payload, dict) else None
    return schema if isinstance(schema, dict) else None


def csv_header(columns: list[str] | tuple = ()) -> list[str]:
    """The header of a CSV download: ``CSV_HEADER``, or a column per property then the error."""
    if not columns:
        return list(CSV_HEADER)
    return ["index", "item", *columns, ERROR_COLUMN, *USAGE_COLUMNS]


def cells(value: Any, columns: list[str] | tuple) -> list[str | None]:
    """A result shown in ``columns`` (its properties: text as is, anything else as JSON text),
    then its error; an item without a result has empty cells."""
    if not isinstance(value, dict):
        return [None] * len(columns) + [None if value is None else _text(value)]
    if set(value) == {ERROR_COLUMN} and ERROR_COLUMN not in columns:  # the item's error
        return [None] * len(columns) + [_text(value[ERROR_COLUMN])]
    return [None if value.get(name) is None else _text(value[name]) for name in columns] + [None]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def csv_row(index: int, item: Any, value: Any, usage: dict[str, int] | None = None,
            columns: list[str] | tuple = ()) -> list:
    """One row of a CSV download (web and CLI): index, item, result (text as is, else JSON) --
    or, with ``columns``, one cell per property and the item's error --, then the item's
    calls and tokens (empty when not known: no model call, or an older job)."""
    if columns:
        shown = [spreadsheet_cell(cell) for cell in cells(value, columns)]
    else:
        shown = [spreadsheet_cell(None if value is None else _text(value) if not isinstance(value, str) else value)]
    return [index, spreadsheet_cell(item if item is None or isinstance(item, str) else json.dumps(item)),
            *shown, *((usage or {}).get(column, "") for column in USAGE_COLUMNS)]


def jsonl_row(index: int, item: Any, value: Any, usage: dict[str, int] | None = None) -> str:
    """One line of a JSON-lines download (web and CLI)."""
    return json.dumps({"index": index, "item": item, "result": value, "usage": usage}, ensure_ascii=False) + "\n"


def chosen_items(connection: Redis, selection: dict) -> list[str]:
    """The items of the job ``selection`` names that its results choose (``items_from``,
    jobs/read/selection.py), in their order, from Redis or the archive: their inputs, or with
    ``results`` their results."""
    rows = iter_results(connection, selection["job"])
    taken = (selection_taken(selection, item, result) for _, item, result, _ in rows if chosen(selection, result))
    return [text for text in taken if text is not None]


def stored_payload(connection: Redis, job_id: str) -> dict | None:
    """A job's payload as submitted, without reading its items twice: its copy in Redis, else the
    archive's once that copy has left (None when neither holds it, or the copy cannot be read)."""
    raw = connection.get(keys.payload(job_id))
    payload = None
    if raw is not None:
        try:
            payload = payload_copy.decode(raw)
        except ValueError:
            payload = None
    if payload is None and _archive_may_hold(connection, job_id):
        payload = reading.payload(job_id, connection, with_items=False)
    return payload
