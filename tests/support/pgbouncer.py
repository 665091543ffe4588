"""A transaction-mode PgBouncer in front of the test PostgreSQL, started like the server is.

Debian's `pgbouncer` package provides the binary (`make test-pooler` installs it). PgBouncer will
not run as root, so when the tests are root it runs as the unprivileged user the embedded
server runs as. Every database name is routed to the one server (`* =`), so the per-test
databases need no configuration; authentication is `trust` on loopback, as the server's is.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

BINARY_PATHS = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
RUN_AS = "pgserver"  # pgserver's system user, when the tests run as root


def binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in BINARY_PATHS if os.access(p, os.X_OK)), None
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgBouncer:
    """`pgbouncer` in `pool_mode = transaction` in front of `server_url`'s server."""

    def __init__(self, server_url: str, workdir: Path, *, pool_size: int = 20) -> None:
        exe = binary()
        if exe is None:
            raise RuntimeError("pgbouncer is not installed: `make test-pooler` installs it")
        server = conninfo_to_dict(server_url)
        self.port = _free_port()
        self.user = str(server.get("user") or "postgres")
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "users.txt").write_text(f'"{self.user}" ""\n')
        self.log = workdir / "pgbouncer.log"
        (workdir / "pgbouncer.ini").write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={server.get('host') or '127.0.0.1'} "
                    f"port={server.get('port') or 5432} user={self.user}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {workdir / 'users.txt'}",
                    "pool_mode = transaction",
                    f"default_pool_size = {pool_size}",
                    "max_client_conn = 2000",
                    f"logfile = {self.log}",
                    f"pidfile = {workdir / 'pgbouncer.pid'}",
                    "ignore_startup_parameters = extra_float_digits,options",
                    "",
                ]
            )
        )
        argv = [exe, str(workdir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            entry = pwd.getpwnam(RUN_AS)
            for path in (workdir, *workdir.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            argv = [
                "setpriv",
                f"--reuid={entry.pw_uid}",
                f"--regid={entry.pw_gid}",
                "--init-groups",
                *argv,
            ]
        # It logs to `logfile` too; its stderr copy would only clutter the test output.
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait_listening()

    def url(self, dbname: str) -> str:
        """A connection URL through the pooler to database `dbname`."""
        return make_conninfo(
            "", host="127.0.0.1", port=str(self.port), user=self.user, dbname=dbname
        )

    def _wait_listening(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not listen: {self.log_text()[-2000:]}")

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(5)
