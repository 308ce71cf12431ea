"""leash's own copy of a job's payload (``keys.payload``), in as few bytes as it takes.

The copy is read rarely (a job's results list its items; a replay rebuilds RQ's side of a job
deleted behind leash's back) but kept for the whole result TTL, so it is stored
zlib-compressed when that is smaller. Releases before this one stored plain JSON, and Redis
outlives releases: both forms are read. They cannot be confused: a JSON object starts with
``{`` and a zlib stream with ``x`` (0x78, its header byte at every level).
"""

from __future__ import annotations

import json
import zlib

#: zlib level: the payload is written once and read rarely, so spend the CPU (it is tiny).
LEVEL = 9


def encode(payload: dict) -> bytes:
    """The stored form: compressed unless that is not smaller (a tiny payload)."""
    plain = json.dumps(payload, separators=(",", ":")).encode()
    packed = zlib.compress(plain, LEVEL)
    return packed if len(packed) < len(plain) else plain


def decode(raw: bytes | str) -> dict:
    """The payload from either stored form; ValueError for anything else."""
    if isinstance(raw, str):
        raw = raw.encode()
    if raw[:1] == b"x":
        try:
            raw = zlib.decompress(raw)
        except zlib.error as exc:
            raise ValueError(f"stored payload is not valid zlib: {exc}") from None
    return json.loads(raw)
