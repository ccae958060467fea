"""A PostgreSQL server of a benchmark's or a test's own: initdb into a temporary directory,
started and stopped with pg_ctl (so a chaos run can restart it), removed at the end; and a
fresh database on a server that runs already (``fresh_database``).

    with ThrowawayPostgres() as server:
        url = server.url          # postgresql://postgres@127.0.0.1:PORT/postgres
        server.restart()

The server binaries are Debian's ``postgresql`` package's (``/usr/lib/postgresql/*/bin``, the
newest); as root the server runs as the ``postgres`` user, as PostgreSQL requires.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import psycopg

from airflow_quota.devtools.stack import free_port


class NoPostgres(RuntimeError):
    """No PostgreSQL server binaries on this machine (``apt-get install postgresql``)."""


class ThrowawayPostgres:
    """A fresh PostgreSQL cluster in a temporary directory, trust authentication, user postgres."""

    def __init__(self) -> None:
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
        if not bins:
            raise NoPostgres("no PostgreSQL server binaries in /usr/lib/postgresql (apt-get install postgresql)")
        self.bin = bins[-1]
        self.base = Path(tempfile.mkdtemp(prefix="quota-bench-pg-"))
        self.run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.run_as:
            shutil.chown(self.base, "postgres")
        self.data = self.base / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._ctl("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres")

    def _ctl(self, program: str, *args: str) -> None:
        subprocess.run([*self.run_as, str(self.bin / program), *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """Start the server and wait until it answers (pg_ctl -w)."""
        options = f"-p {self.port} -k {self.base} -h 127.0.0.1"
        self._ctl("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.base / "server.log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: every session ends; ``immediate``: as a crash)."""
        self._ctl("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def answers(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2):
                return True
        except psycopg.Error:
            return False

    def remove(self) -> None:
        """Stop the server if it runs and delete its directory."""
        if (self.data / "postmaster.pid").exists():
            self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> ThrowawayPostgres:
        try:
            self.start()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.remove()


@contextlib.contextmanager
def fresh_database(admin: str, prefix: str = "quota_test") -> Iterator[str]:
    """The URL of a new, empty database on the server of ``admin`` (a libpq URL), dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{admin.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
