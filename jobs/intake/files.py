"""Items from a file, read one way for the form's upload and ``leash submit FILE``: UTF-8 text
(a byte-order mark is skipped), one item per line, or for a ``.csv`` the column named text,
item, review... if the header names one, else the column with the most text (csv.Sniffer finds
the delimiter and whether there is a header). A file that is not UTF-8, or not CSV it can read,
is a ``FileProblem`` whose message says what to fix."""

from __future__ import annotations

import csv
import io

from jobs.config import limits
from jobs.errors import InvalidJob

CSV_TEXT_COLUMNS = ("text", "item", "items", "input", "prompt", "review", "comment", "message", "question",
                    "sentence", "content", "body")


class FileProblem(InvalidJob):
    """The file cannot be read as items; the message says where and how to fix it."""


def read_items(data: bytes, filename: str = "") -> list[str]:
    """The items of a file's bytes: a ``.csv`` by its text column, anything else a line each."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileProblem(f"the file is not UTF-8 text (byte {exc.start + 1} cannot be read); save it as UTF-8 "
                          "and try again") from None
    if filename.lower().endswith(".csv"):
        return _csv_items(text)
    return lines(text)


def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


#: Delimiters the sniffer may choose from (spreadsheets export ; in much of Europe).
CSV_DELIMITERS = ",;\t|"
#: csv.Sniffer's quote-guessing regexes take worse than quadratic time on crafted text (64 KB of
#: ',"' took 102 s; 2 KB of the worst sample found takes 0.2 s): a header and a few rows are enough.
SNIFF_CHARS = 2048


def _dialect_and_header(text: str) -> tuple[type[csv.Dialect] | csv.Dialect, bool]:
    """csv.Sniffer's guess of the dialect and whether the first row is a header; a single
    column defeats the delimiter guess, so that falls back to plain CSV, no header."""
    sample = text[:SNIFF_CHARS]
    sniffer = csv.Sniffer()
    try:
        dialect = sniffer.sniff(sample, delimiters=CSV_DELIMITERS)
        return dialect, sniffer.has_header(sample)
    except csv.Error:
        return csv.excel, False


def _text_column(rows: list[list[str]]) -> int:
    """The column holding the most text: the items, not ids, dates or scores. One pass over the
    cells (the cells of every row, never every column of every row: one wide row must not make
    each short row cost its width)."""
    totals = [0] * max(len(row) for row in rows)
    for row in rows:
        for column, cell in enumerate(row):
            totals[column] += len(cell.strip())
    return max(range(len(totals)), key=totals.__getitem__)


def _read_rows(reader) -> list[list[str]]:
    """The rows with any text, refusing a row wider than LEASH_MAX_CSV_COLUMNS as it is read."""
    most = limits().max_csv_columns
    rows = []
    for row in reader:
        if len(row) > most:
            raise FileProblem(f"line {reader.line_num} has {len(row)} columns (at most {most}, LEASH_MAX_CSV_COLUMNS); "
                             "give only the column of items, or a .txt with one item per line")
        if any(cell.strip() for cell in row):
            rows.append(row)
    return rows


def _csv_items(text: str) -> list[str]:
    """The items of a CSV file: the column named text, item, review... if the header names
    one, else the column with the most text; the header row (named, or detected by
    csv.Sniffer) is not an item."""
    dialect, sniffed_header = _dialect_and_header(text)
    # strict: an unterminated quote is an error, not one giant item swallowing the rest.
    reader = csv.reader(io.StringIO(text), dialect, strict=True)
    try:
        rows = _read_rows(reader)
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            raise FileProblem(f"line {reader.line_num}: a cell is longer than {csv.field_size_limit()} characters; "
                             f"items may be at most {limits().max_item_chars} (LEASH_MAX_ITEM_CHARS)") from None
        raise FileProblem(f"line {reader.line_num}: the file is not valid CSV ({exc}); check its quotes, "
                         "or give a .txt with one item per line") from None
    if not rows:
        return []
    header = [cell.strip().lower() for cell in rows[0]]
    column = next((header.index(name) for name in CSV_TEXT_COLUMNS if name in header), None)
    if column is not None or sniffed_header:
        rows = rows[1:]
    if not rows:
        return []
    if column is None:
        column = _text_column(rows)
    return [row[column].strip() for row in rows if len(row) > column and row[column].strip()]
