"""Whether a relative path names a file beneath a directory, never looking outside it.

`file_exists` asks about a job's work directory, but the engine answers (often as root) and
the job owns the directory: it can plant a symbolic link to any file of the host, or to ``/``,
and ask about the link. So the path is walked one component at a time from a descriptor of the
directory, as the kernel would walk it, except that nothing is followed out: a link with an
absolute target, or one that climbs above the directory, is `LinkOut`. Each step opens the next
directory relative to the one before with ``O_NOFOLLOW``, so a component the job swaps for a
link while the walk runs is refused (``ELOOP``) rather than followed; ``..`` goes back to the
descriptor the walk came from, never to the directory's real parent.
"""

from __future__ import annotations

import errno
import os
import stat

from workflow_engine.errors import LinkOut

#: How many symbolic links one lookup follows at most, as the kernel's own limit.
MAX_LINKS = 40
_DIRECTORY = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def exists_beneath(root: str, path: str) -> bool:
    """Whether `path` (relative) names something beneath the directory `root`.

    Links are followed while they stay beneath `root`; `LinkOut` when one leads out of it,
    `OSError` when the path cannot be looked up (too many links, a component swapped mid-walk).
    """
    directories = [os.open(root, _DIRECTORY)]  # from `root` down to where the walk is
    pending = _components(path)  # a stack: the next component last
    links = 0
    try:
        while pending:
            name = pending.pop()
            if name == "..":
                if len(directories) == 1:
                    raise LinkOut(name)
                os.close(directories.pop())
                continue
            try:
                found = os.stat(name, dir_fd=directories[-1], follow_symlinks=False)
            except FileNotFoundError:
                return False
            if stat.S_ISLNK(found.st_mode):
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                target = os.readlink(name, dir_fd=directories[-1])
                if target.startswith("/"):
                    raise LinkOut(name)
                pending += _components(target)
            elif not pending:
                return True
            elif not stat.S_ISDIR(found.st_mode):
                return False  # `file/more`: nothing is beneath a file
            else:
                directories.append(os.open(name, _DIRECTORY, dir_fd=directories[-1]))
        return True  # `.`: the directory itself
    finally:
        for fd in directories:
            os.close(fd)


def _components(path: str) -> list[str]:
    """`path`'s names as a stack (the first one last), without empty and ``.`` ones."""
    return [name for name in reversed(path.split("/")) if name not in ("", ".")]
