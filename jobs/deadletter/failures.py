"""The failure report: "one bug or forty?" in a second.

Failed jobs are grouped by kind and the first 80 characters of their error's first line
("ExceptionType: message"), after the parts that differ between occurrences of one bug —
ids, numbers, hex, UUIDs, URLs, addresses, paths — are replaced by placeholders.

It reads the failed index (job id -> failed_at, written by the Lua transitions), never
scans jobs: ZRANGEBYSCORE for the window, then one Lua call per batch returns each job's
kind and error head (see ``lua/failure_heads_v1.lua``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from redis import Redis

from jobs import keys
from jobs.core import clock
from jobs.core.details import is_canceled
from jobs.lifecycle import scripts

GROUP_CHARS = 80
#: Characters of the first line read before normalising (placeholders are shorter than what
#: they replace, so more than 80 are needed to fill 80 after normalising).
HEAD_CHARS = 400
BATCH = 1000
PIPELINED = 10

# Applied to each whitespace-separated token (none of these shapes contains a space); at each
# position the first alternative that matches wins, so the wider shapes come first and their
# digits are not taken by <n>. Replacing too much only merges messages that differ in numbers
# (the point); replacing too little splits one bug into many groups.
_SHAPES = re.compile("|".join([
    r"(?P<url>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>)\]},]+)",
    r"(?P<email>\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b)",
    r"(?P<uuid>\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b)",
    r"(?P<ip>\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b)",
    r"(?P<path>(?<![\w.])(?:~|\.{1,2})?(?:/[\w.@%+=-]+){2,}/?)",
    r"(?P<hex>\b0[xX][0-9a-fA-F]+\b)",
    # Words with digits: random ids and hashes become <id>, "label_12" becomes "label_<n>".
    r"(?P<word>(?<![\w-])(?=[\w-]*\d)[\w-]{6,}(?![\w-]))",
    # Long tokens without a digit: random ids too, unless they read as a word (see _long).
    r"(?P<long>(?<![\w-])[\w-]{20,}(?![\w-]))",
    r"(?P<n>\d+(?:[.,]\d+)*)",
]))
_PUNCTUATION = ".,:;!?()[]{}'\"`"
_DIGITS = re.compile(r"\d+")
# Places where a letter meets a digit: "label_12" has one, "Q75GfE4G44" many.
_SWITCH = re.compile(r"(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])")
# CamelCase names ("ConnectionRefusedError", "SSLCertVerificationError"): every capital run
# is followed by at least two lower-case letters, and about a third of the letters are vowels.
# Random ids (a fifth vowels) rarely pass both.
_CAMEL = re.compile(r"^(?:[a-z]+|[A-Z]+[a-z]{2,})(?:[A-Z]+[a-z]{2,})*$")
_VOWELS = frozenset("aeiouyAEIOUY")


def _long(text: str) -> str:
    if text.islower() or text.isupper():  # snake_case, CONSTANT_NAMES, words
        return text
    if _CAMEL.match(text) and sum(c in _VOWELS for c in text) >= 0.28 * len(text):
        return text
    return "<id>"


def _word_with_digits(text: str) -> str:
    if len(text) >= 20 or len(_SWITCH.findall(text)) >= 2:
        return "<id>"
    return _DIGITS.sub("<n>", text)


def _placeholder(match: re.Match) -> str:
    shape = match.lastgroup
    if shape == "word":
        return _word_with_digits(match.group())
    if shape == "long":
        return _long(match.group())
    return f"<{shape}>"


def normalise(first_line: str) -> str:
    """The group key text for an error's first line: whitespace collapsed, variable parts
    replaced, cut to 80 characters. Works token by token and stops once 80 are filled."""
    out: list[str] = []
    length = 0
    for token in first_line.split():
        bare = token.strip(_PUNCTUATION)
        if not bare:
            pass
        elif not bare.isalpha():
            token = _SHAPES.sub(_placeholder, token)
        elif len(bare) >= 20 and _long(bare) != bare:
            token = token.replace(bare, "<id>")
        out.append(token)
        length += len(token) + 1
        if length > GROUP_CHARS:
            break
    return " ".join(out)[:GROUP_CHARS]


@dataclass
class Group:
    kind: str
    error: str
    count: int = 0
    first_seen: float = float("inf")
    last_seen: float = 0.0
    examples: list[str] = field(default_factory=list)
    #: Every job of the group, oldest failure first, when the report was asked for them.
    job_ids: list[str] | None = None

    def add(self, job_id: str, failed_at: float) -> None:
        self.count += 1
        self.first_seen = min(self.first_seen, failed_at)
        if self.job_ids is not None:
            self.job_ids.append(job_id)
        if failed_at >= self.last_seen:
            self.last_seen = failed_at
            # Scanned oldest first: the examples end up the two latest.
            self.examples = (self.examples + [job_id])[-2:]

    def as_dict(self) -> dict:
        found = {"kind": self.kind, "error": self.error, "count": self.count,
                 "first_seen": clock.iso(self.first_seen), "last_seen": clock.iso(self.last_seen),
                 "examples": self.examples}
        if self.job_ids is not None:
            found["job_ids"] = self.job_ids[::-1]  # newest first, as a page lists them
        return found


def failed_ids(connection: Redis, since: float | None = None, now: float | None = None) -> list[str]:
    """Ids in the failed index, oldest failure first; ``since`` seconds back, or all."""
    now = clock.wall() if now is None else now
    low = "-inf" if since is None else now - since
    return [member.decode() for member in connection.zrangebyscore(keys.FAILED_INDEX, low, "+inf")]


@dataclass
class Head:
    job_id: str
    failed_at: float | None
    kind: str
    first_line: str


def iter_heads(connection: Redis, job_ids: list[str], limit: int = HEAD_CHARS) -> Iterator[Head | None]:
    """Per id: when it failed, its kind and its error's first line; None for ids pruned from
    the index. Batches go out pipelined from a second thread, so Redis works on the next
    batches while this thread parses and groups the last ones."""
    groups = [job_ids[i:i + BATCH * PIPELINED] for i in range(0, len(job_ids), BATCH * PIPELINED)]
    with ThreadPoolExecutor(max_workers=1) as fetcher:
        pending = fetcher.submit(_fetch_heads, connection, groups[0], limit) if groups else None
        for n, group in enumerate(groups):
            replies = pending.result()
            if n + 1 < len(groups):
                pending = fetcher.submit(_fetch_heads, connection, groups[n + 1], limit)
            ids = iter(group)
            for reply in replies:
                for raw in reply:
                    job_id = next(ids)
                    if raw is None:
                        yield None
                        continue
                    failed_at, kind, first_line = raw.decode(errors="replace").split("\t", 2)
                    yield Head(job_id, float(failed_at) if failed_at else None, kind, first_line)


def heads(connection: Redis, job_ids: list[str], limit: int = HEAD_CHARS) -> list[Head | None]:
    return list(iter_heads(connection, job_ids, limit))


_JOB_KEY_PREFIX_LEN = len(keys.job(""))


def _fetch_heads(connection: Redis, job_ids: list[str], limit: int) -> list:
    with connection.pipeline(transaction=False) as pipe:
        for start in range(0, len(job_ids), BATCH):
            chunk = job_ids[start:start + BATCH]
            scripts.run(connection, "failure_heads_v1",
                        keys={"failed_index": keys.FAILED_INDEX, "jobs": [keys.job(i) for i in chunk]},
                        args=[limit, _JOB_KEY_PREFIX_LEN], pipeline=pipe)
        return pipe.execute()


def report(connection: Redis, since: float | None = 24 * 3600, kind: str | None = None,
           now: float | None = None, include_canceled: bool = False, owner: str | None = None,
           with_ids: bool = False) -> dict:
    """Groups, biggest first, and the number of failed jobs they cover; canceled jobs are
    left out unless ``include_canceled``. ``owner``: only that owner's jobs (its failed
    index); ``with_ids``: each group lists all its jobs (``job_ids``, newest first)."""
    groups: dict[tuple[str, str], Group] = {}
    seen: dict[str, str] = {}  # raw head -> normalised (repeated heads are common)
    total = 0
    ids = failed_ids(connection, since, now=now)
    if owner is not None:
        owned = {member.decode() for member in connection.zrange(keys.owner_state(owner, "failed"), 0, -1)}
        ids = [job_id for job_id in ids if job_id in owned]
    for head in iter_heads(connection, ids):
        if head is None or (kind is not None and head.kind != kind):
            continue
        if not include_canceled and is_canceled(head.first_line):
            continue
        text = seen.get(head.first_line)
        if text is None:
            text = seen[head.first_line] = normalise(head.first_line)
        group = groups.get((head.kind, text))
        if group is None:
            group = groups[(head.kind, text)] = Group(head.kind, text, job_ids=[] if with_ids else None)
        group.add(head.job_id, head.failed_at or 0.0)
        total += 1
    ordered = sorted(groups.values(), key=lambda g: (-g.count, -g.last_seen))
    return {"total": total, "groups": [g.as_dict() for g in ordered]}
