"""Files that hold secrets are used only while other users of the host cannot read them.

The engine reads credentials from files its settings name: the tokens file, the TLS key, the
model's API key file, the worker nodes' token files. Running as root, it runs each job as a
user of its own; a file those users (or any other user of the host) may read hands them the
credential: a job once read the orchestrator's token from a world-readable tokens file. One
they may write lets them put their own in (a caller of their own in the tokens file, a client
CA of their own).

So each such file is opened once, its mode read from the open file (`read`), and judged
(`exposed`): readable by group or others while it holds a secret, or writable by them at all.
As root the engine refuses it at start-up, naming the file and the mode to set; not as root
(its jobs then run as its own user, and read what it reads in any case) it logs a warning.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

_READ = stat.S_IRGRP | stat.S_IROTH
_WRITE = stat.S_IWGRP | stat.S_IWOTH


def read(path: str | Path) -> tuple[bytes, int]:
    """The file's content and its mode, from one open (the mode judged is the content's)."""
    with open(path, "rb") as file:  # a symbolic link (a Kubernetes Secret's) is followed
        mode = os.fstat(file.fileno()).st_mode
        return file.read(), mode


def read_stripped(
    where: str, path: str | Path, error: Callable[[str], Exception]
) -> tuple[str, int]:
    """A credential file's text, stripped, and its mode (see `read`); `error(message)`, the
    message starting with `where` (the setting), when it cannot be read."""
    try:
        content, mode = read(path)
    except OSError as exc:
        raise error(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    return content.decode("utf-8").strip(), mode


def exposed(where: str, path: str | Path, mode: int, *, holds: str | None) -> str | None:
    """Why a file with `mode` may not be used, as root: it holds `holds` (None: no secret, such
    as a tokens file of hashes only) and group or others may read it, or they may write it.

    Not as root: logs that as a warning and returns None, as for a file nobody else can use.
    `where` names the setting (and the file) the message starts with.
    """
    reads = mode & _READ if holds else 0
    writes = mode & _WRITE
    if not reads and not writes:
        return None
    what = " and ".join(word for word, bits in (("readable", reads), ("writable", writes)) if bits)
    whom = " and ".join(
        word
        for word, bits in (
            ("its group", (reads | writes) & (stat.S_IRGRP | stat.S_IWGRP)),
            ("others", (reads | writes) & (stat.S_IROTH | stat.S_IWOTH)),
        )
        if bits
    )
    harm = (
        f"it holds {holds}, which other users of this host (every job among them) could read"
        if reads
        else "other users of this host (every job among them) could put their own content in"
    )
    to_set, meaning = ("600", "its owner's alone") if holds else ("644", "its owner alone writes")
    problem = (
        f"{where}: {what} by {whom} (mode {stat.S_IMODE(mode):04o}), and {harm}; "
        f"chmod {to_set} {path} ({meaning})"
    )
    if os.geteuid() == 0:
        return problem
    log.warning("secret_file_exposed", problem=problem)
    return None
