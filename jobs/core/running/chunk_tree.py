"""A reduce's chunk tree: the engine behind the ``reduce`` kind (jobs/kinds.py), as items.py is
the engine behind ``ctx.for_each``.

Many texts, one answer. The texts are packed, in their order, into chunks of at most
LEASH_REDUCE_CHUNK_TOKENS estimated tokens (a text longer than that is a chunk alone); each chunk
is reduced to a partial by one model call; the partials are packed and reduced again, level by
level, until one call holds every text left: its answer is the job's one result.

Every call's answer is checkpointed in the job's items hash as an item's result is (one fenced
write that renews the lease, carries the call's usage and writes the request cache): the answer
at index 0, each partial at a negative index (-1, -2, ... numbered level by level), which no
reader of results asks for (pages read from 0 up) and the archive leaves out. A partial is kept
with a digest of the texts it reduced: a resumed attempt packs its chunks again, takes each
partial whose digest matches and asks only for the others, so a setting changed between
attempts costs calls, never a wrong answer.

Progress counts calls: ``done`` is the answers stored (the hash's length), ``total`` the calls
of the levels packed so far plus one for the answer, so it grows when the partials need more
than one call.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jobs import keys
from jobs.core.running.items import ItemRun

#: The index of the answer in the job's items hash (partials are below it).
ANSWER_INDEX = 0


def pack(texts: Sequence[str], bound: int, measure: Callable[[str], int]) -> list[list[str]]:
    """The texts in chunks, in order, each of at most ``bound`` tokens by ``measure`` (a text
    larger than ``bound`` alone in its chunk). At least one chunk, even for no texts."""
    chunks: list[list[str]] = [[]]
    size = 0
    for text in texts:
        tokens = measure(text)
        if chunks[-1] and size + tokens > bound:
            chunks.append([])
            size = 0
        chunks[-1].append(text)
        size += tokens
    return chunks


def digest(texts: Sequence[str]) -> str:
    """What a partial was made of, in 16 hex digits (the texts, each delimited)."""
    whole = hashlib.sha256()
    for text in texts:
        whole.update(len(text.encode()).to_bytes(8, "big"))
        whole.update(text.encode())
    return whole.hexdigest()[:16]


@dataclass
class _Level:
    """One level's calls as an item run sees them: position ``n`` is index ``first - n``."""

    ctx: Any  # the job's context (jobs.core.running.context.JobContext)
    first: int  # the index of its first call (ANSWER_INDEX for the last level)

    @property
    def attempt(self):
        return self.ctx.attempt

    @property
    def job_id(self) -> str:
        return self.ctx.job_id

    def index(self, position: int) -> int:
        return self.first - position

    def checkpoint_encoded(self, position: int, encoded: str) -> None:
        self.ctx.checkpoint_encoded(self.index(position), encoded)

    def heartbeat_done(self):
        return self.ctx.heartbeat_done()

    def enter_items(self, stop, renewer) -> None:
        self.ctx.enter_items(stop, renewer)

    def leave_items(self) -> None:
        self.ctx.leave_items()

    def flush_usage(self, all_threads: bool = False) -> None:
        self.ctx.flush_usage(all_threads)


def run(ctx, texts: Sequence[str], ask: Callable[[list[str], bool], str], bound: int,
        measure: Callable[[str], int], concurrency: int | None = None) -> str | None:
    """The one answer to ``texts``: each chunk's partial by ``ask(chunk_texts, True)``, level by
    level, then the answer by ``ask(texts_left, False)``, each call checkpointed as the module
    says; calls a checkpoint answers are never asked again. Raises what an item run raises (a
    cancel, a hand-off, a lost lease, the first call's error). No texts (another job's results
    that chose none): no call, no answer (None)."""
    if not texts:
        ctx.progress(0, total=0)
        return None
    stored = ctx.items_done()
    if isinstance(stored.get(ANSWER_INDEX), str):
        return stored[ANSWER_INDEX]
    width = ctx.item_concurrency(concurrency)
    level, next_index, planned = list(texts), -1, 0
    while True:
        chunks = pack(level, bound, measure)
        if next_index < -1 and len(chunks) >= len(level) > 1:  # partials as long as the bound: two a call
            chunks = [level[n:n + 2] for n in range(0, len(level), 2)]
        last = len(chunks) == 1
        first = ANSWER_INDEX if last else next_index
        planned += len(chunks)
        ctx.progress(ctx.connection.hlen(keys.items(ctx.job_id)), total=planned + (0 if last else 1))
        if last:
            return ItemRun(_Level(ctx, first), chunks, lambda chunk: ask(chunk, False), width).run({})[0]
        done = {}
        for position, chunk in enumerate(chunks):
            kept = stored.get(first - position)
            if isinstance(kept, dict) and kept.get("of") == digest(chunk) and isinstance(kept.get("partial"), str):
                done[position] = kept
        answered = ItemRun(_Level(ctx, first), chunks, lambda chunk: {"partial": ask(chunk, True), "of": digest(chunk)},
                           width).run(done)
        level = [entry["partial"] for entry in answered]
        next_index = first - len(chunks)
