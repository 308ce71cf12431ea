"""Loads the Lua scripts in ``jobs/lua/`` (one file per script, KEYS/ARGV in its header;
files starting with ``_`` hold shared helpers).

Scripts are registered per Redis client and called through redis-py's ``Script`` objects
(EVALSHA, falling back to EVAL after a Redis restart flushed the script cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from redis import Redis
from redis.commands.core import Script

LUA_DIR = Path(__file__).parents[1] / "lua"


#: Every script's text, read once at import: a running process never reads the files again,
#: so installing another release over this one (in place) cannot change what it runs.
_FILES = {path.stem: path.read_text() for path in LUA_DIR.glob("*.lua")}


def source(name: str) -> str:
    """A script's text, after the shared helpers in ``_lib.lua`` (Redis scripts cannot import)."""
    return _FILES["_lib"] + "\n" + _FILES[name]


def names() -> list[str]:
    return sorted(name for name in _FILES if not name.startswith("_"))


_registered: dict[tuple[int, str], Script] = {}


def script(connection: Redis, name: str) -> Script:
    key = (id(connection), name)
    registered = _registered.get(key)
    if registered is None or registered.registered_client is not connection:
        registered = connection.register_script(source(name))
        _registered[key] = registered
    return registered


def run(connection: Redis, name: str, keys: list[str], args: list[Any], pipeline=None) -> Any:
    return script(connection, name)(keys=keys, args=args, client=pipeline)
