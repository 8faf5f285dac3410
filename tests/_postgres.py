"""A throwaway PostgreSQL server for the sweep tests: Debian's `postgresql` package (`.ci/run`
installs it when missing), a fresh cluster in a temporary folder, listening on 127.0.0.1 on a
free port, stopped and removed afterwards.

`PostgresServer.start()` runs `initdb` and `pg_ctl start`; as root it runs them as the user
`nobody` (PostgreSQL refuses to run as root). `url(database)` is the SQLAlchemy URL
(`postgresql+psycopg://dew@127.0.0.1:PORT/DATABASE`) of a database `create_database` made.
The tests run it with `fsync=off`; `benchmarks/sweep_workers.py` imports this module (it needs
no pytest) and runs it with PostgreSQL's default, `fsync=on`, in a folder on the disk it
measures.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pathlib
import pwd
import shutil
import socket
import subprocess
import tempfile


def server_binaries() -> pathlib.Path | None:
    """The folder holding `initdb`, `pg_ctl` and `postgres`, or None when none is installed."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return pathlib.Path(found).resolve().parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):  # Debian's
        if all(os.access(f"{folder}/{tool}", os.X_OK) for tool in ("initdb", "pg_ctl")):
            return pathlib.Path(folder)
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PostgresServer:
    def __init__(
        self, binaries: pathlib.Path, *, parent: str | None = None, fsync: bool = False
    ) -> None:
        self.binaries = binaries
        self.fsync = fsync
        self.folder = pathlib.Path(tempfile.mkdtemp(prefix="dew-postgres-", dir=parent))
        self.data = self.folder / "data"
        self.port = _free_port()
        self.user = "dew"
        self._as = []
        if os.geteuid() == 0:  # the server refuses root: run it as nobody
            nobody = pwd.getpwnam("nobody")
            os.chown(self.folder, nobody.pw_uid, nobody.pw_gid)
            self._as = ["runuser", "-u", "nobody", "--"]

    def _run(self, tool: str, *arguments: str) -> None:
        command = [*self._as, str(self.binaries / tool), *arguments]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.strip()}")

    def start(self) -> PostgresServer:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            self.user,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        self.resume()
        return self

    def resume(self) -> None:
        """Start the server (again, after `stop`) on the same port and data."""
        fsync = "on" if self.fsync else "off"
        options = f"-h 127.0.0.1 -p {self.port} -k {self.folder} -c fsync={fsync}"
        log = str(self.folder / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")

    def stop(self) -> None:
        """Stop the server at once (`-m immediate`: what a crash or a lost host looks like)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def create_database(self, name: str) -> str:
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, name)
        return self.url(name)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def remove(self) -> None:
        with contextlib.suppress(RuntimeError):  # already stopped
            self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
