"""A throwaway PostgreSQL for the archive's tests: its own data directory in a temp folder, on a
free loopback port, started with ``initdb``/``pg_ctl`` and stopped by its postmaster's pid.

The binaries are PostgreSQL's own, found on PATH or through ``pg_config --bindir`` (Debian puts
them beside each other under a versioned folder; CI installs Debian's ``postgresql``). Running as
root (CI does), the server runs as the ``postgres`` user, which owns the temp folder: PostgreSQL
refuses to run as root. Where no binaries exist, ``find_binaries`` raises: a test asking for
Postgres fails, saying what to install, rather than passing without it. The machine's own
Postgres (port 5432) is never touched."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

#: What to install where no PostgreSQL binaries are found.
INSTALL_HINT = "PostgreSQL's server binaries (initdb, pg_ctl, postgres): apt-get install postgresql"


class NoPostgres(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def find_binaries() -> Path:
    """The folder holding initdb, pg_ctl and postgres."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).parent
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        if out and (Path(out) / "pg_ctl").exists() and (Path(out) / "initdb").exists():
            return Path(out)
    for folder in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):  # Debian's layout, newest first
        if (folder / "pg_ctl").exists() and (folder / "initdb").exists():
            return folder
    raise NoPostgres(f"no PostgreSQL server here to test the archive against; install {INSTALL_HINT}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    """One server: ``start()``, ``stop()`` (by pid), ``start()`` again on the same data and port
    (an outage and its end), ``url(database)``, ``create_database()``, ``close()`` at the end."""

    def __init__(self):
        self.bindir = find_binaries()
        self.root = Path(tempfile.mkdtemp(prefix="leash-test-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.pid: int | None = None
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self._databases = 0

    def _run(self, program: str, *args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([*self._as_user, str(self.bindir / program), *args], capture_output=True,
                              text=True, timeout=120, check=False, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
        return done

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off")
        self._run("pg_ctl", "start", "-D", str(self.data), "-w", "-t", "60", "-l", str(self.root / "log"),
                  "-o", options)
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        """Stop the server by its postmaster's pid (fast shutdown), waiting until it is gone."""
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGINT)
        except ProcessLookupError:
            self.pid = None
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(self.pid, signal.SIGKILL)
        self.pid = None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its SQLAlchemy URL."""
        import psycopg

        self._databases += 1
        name = f"leash_test_{self._databases}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    """One throwaway PostgreSQL for this test process (each xdist worker starts its own)."""
    server = Postgres()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(params=["sqlite", "postgres"])
def archive_url(request, env, tmp_path):
    """The archive, once in a SQLite file and once in a fresh database of a real PostgreSQL."""
    from jobs.archive import database

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    else:
        url = request.getfixturevalue("postgres_server").create_database()
    env.setenv("LEASH_ARCHIVE_URL", url)
    database.forget()
    yield url
    database.forget()
