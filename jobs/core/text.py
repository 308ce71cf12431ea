"""One rule for text. What comes in must be Unicode that UTF-8 can carry: JSON lets a client send a
lone UTF-16 surrogate (``"\\udfff"``), which Python accepts as a string and no UTF-8 output can
write, so every door refuses it with the field's name (``check``). What goes out is always
writable: text stored before this rule, or a model's answer, goes through ``printable``, which
shows each lone surrogate as U+FFFD (the replacement character) and leaves all else as it is."""

from __future__ import annotations

from typing import Any

from jobs.errors import InvalidJob

REPLACEMENT = "\ufffd"


def decoded(value: Any) -> Any:
    """A value read from Redis as text: bytes decoded as UTF-8, anything else (None, a str, a
    number from a Lua reply) as it is."""
    return value.decode() if isinstance(value, bytes) else value


def _bad(text: str) -> str | None:
    """The first character UTF-8 cannot encode, or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return None


def check(payload: dict) -> None:
    """Raise InvalidJob naming the top-level field whose text (a value or a key, at any depth)
    is not valid Unicode. The payload's depth is already bounded (jobs.limits)."""
    for field, value in payload.items():
        pending: list[tuple[Any, str]] = [(field, field), (value, field)]
        while pending:
            node, where = pending.pop()
            if isinstance(node, str):
                bad = _bad(node)
                if bad is not None:
                    raise InvalidJob(f"'{printable(field)}' contains text that is not valid Unicode at "
                                     f"{printable(where)}: a lone surrogate (U+{ord(bad):04X}); send UTF-8 text")
            elif isinstance(node, list):
                pending.extend((child, f"{where}[{n}]") for n, child in enumerate(node))
            elif isinstance(node, dict):
                for key, child in node.items():
                    pending.extend(((key, f"{where} (a key)"), (child, f"{where}.{key}")))


def printable(value: Any) -> Any:
    """``value`` with every string (in lists and dicts too) safe to write as UTF-8."""
    if isinstance(value, str):
        if _bad(value) is None:
            return value
        # surrogatepass + replace: a lone surrogate becomes U+FFFD, a well-formed pair its character.
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [printable(child) for child in value]
    if isinstance(value, dict):
        return {printable(key): printable(child) for key, child in value.items()}
    return value


#: Job ids a summary line names; the rest are counted (an `rq empty` of 20,000 jobs is one line).
IDS_LOGGED = 10


def summary_of_ids(ids: list[str]) -> str:
    """The first IDS_LOGGED ids and how many more: a log line about a bulk event (a queue
    emptied, a fleet's leases lapsed, a requeue-all) stays one line, not one per job."""
    more = len(ids) - IDS_LOGGED
    return ", ".join(ids[:IDS_LOGGED]) + (f" and {more} more" if more > 0 else "")
