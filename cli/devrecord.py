"""What a running ``leash dev`` leaves in the state directory for the other commands, and what
they have already told this terminal.

    $XDG_STATE_HOME/leash/               (~/.local/state/leash/ by default)
        dev/<pid>.json                   one record per running ``leash dev``: its Redis and web
                                         addresses; each removes only its own, so stopping one
                                         of several never hides the others
        dev-<port>/                      the data of the ``leash dev`` on web port <port>: its
                                         Redis's files, its session secret (kept across restarts)
        notices/<session>                notices this terminal session has already been shown

A record whose process is gone (``leash dev`` was SIGKILLed) is ignored and removed when met.
A pid reused by another program is told apart by the process's start time.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path

import click

from jobs.config.front import command_line

RECORDS = "dev"
NOTICES = "notices"


def state_dir() -> Path:
    state_home = command_line().xdg_state_home or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state_home) / "leash"


def records_dir() -> Path:
    return state_dir() / RECORDS


def data_dir(port: int) -> Path:
    """Where the ``leash dev`` on web port ``port`` keeps its Redis's files."""
    return state_dir() / f"dev-{port}"


def archive_url(port: int) -> str:
    """The archive of the ``leash dev`` on web port ``port``: a SQLite file beside its Redis's."""
    return f"sqlite:///{data_dir(port) / 'archive.sqlite3'}"


def dev_archive_url(record: dict) -> str | None:
    """The archive of a running ``leash dev`` (from its record's web address)."""
    tail = str(record.get("web_url") or "").rstrip("/").rsplit(":", 1)[-1]
    return archive_url(int(tail)) if tail.isdigit() else None


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot), or None where /proc is absent.
    With the pid it names one process for good: a pid is reused, a (pid, start) pair is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may hold spaces, so count after its closing ")".
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: alive, but then the start time decides
    return started is None or _started(pid) in (None, started)


def _write_private(path: Path, text: str) -> None:
    """Write for this user's eyes only (a REDIS_URL can carry a password): into a new file of a
    random name, created with O_EXCL | O_NOFOLLOW at mode 0600 (never a file or a symlink someone
    placed there beforehand), then renamed over ``path``, which replaces a symlink in its place
    rather than following it; readers never see half a file."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o600)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_record(redis_url: str, web_url: str, pid: int) -> Path:
    path = records_dir() / f"{pid}.json"
    _write_private(path, json.dumps({"redis_url": redis_url, "web_url": web_url, "pid": pid,
                                     "started": _started(pid)}))
    return path


def remove_record(pid: int) -> None:
    (records_dir() / f"{pid}.json").unlink(missing_ok=True)


def running() -> list[dict]:
    """The records of every ``leash dev`` running now, newest first."""
    found = []
    try:
        paths = sorted(records_dir().glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return []
    for path in paths:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
            continue
        if _alive(record["pid"], record.get("started")):
            found.append(record)
        else:
            path.unlink(missing_ok=True)  # its leash dev was killed before it could clean up
    return found


def secret(port: int) -> str:
    """The session secret of the ``leash dev`` on ``port``: made once, so a restart keeps the
    browser's session and the CSRF tokens of pages opened before it."""
    path = data_dir(port) / "secret"
    try:
        return path.read_text().strip()
    except OSError:
        value = secrets.token_urlsafe(32)
        _write_private(path, value)
        return value


def _session() -> str:
    """This terminal session: its session id and the session leader's start time."""
    sid = os.getsid(0)
    return f"{sid}-{_started(sid) or 0}"


def notice_once(text: str) -> None:
    """Say ``text`` on stderr unless this terminal session has been told it already."""
    folder = state_dir() / NOTICES
    path = folder / _session()
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    try:
        if digest in path.read_text().split():
            return
    except OSError:
        pass
    click.echo(text, err=True)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as out:
            out.write(digest + "\n")
        _forget_ended_sessions(folder)
    except OSError:
        pass  # a read-only home: the notice repeats, nothing worse


def _forget_ended_sessions(folder: Path) -> None:
    for path in folder.iterdir():
        sid, _, started = path.name.partition("-")
        if sid.isdigit() and not _alive(int(sid), started if started != "0" else None):
            path.unlink(missing_ok=True)
