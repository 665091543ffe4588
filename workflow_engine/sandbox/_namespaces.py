"""The namespaces a task's local jobs share: one network namespace per task, not one per job.

Every local job runs without network (`sandbox._grant`): in a network namespace whose only
interface, loopback, is down, owned (when the engine is not root) by a user namespace that
maps the engine's user. The kernel spends about half a millisecond of CPU making those, and
more tearing them down later in a kernel worker, which for a ``true`` job is as much as the
rest of its processes. So they are made once per task, by a helper that lives as long as the
runner (``jobwrap --namespaces``, which hands each set over as descriptors on a unix socket);
this module keeps them while the task is in use, and each job's wrapper enters them
(``join-net`` / ``join-userns``) instead of making its own.

Only a task's own jobs share them, and those share more already: the same user and the same
work files. A namespace lives as long as a descriptor names it or a process is in it, so a
job outliving the engine keeps its own, and nothing is ever left to clean up; the engine lets
go of a task's namespaces once it has not started a job of that task for `idle_seconds`, and
of the least recently used beyond `most`.

Where the helper cannot make them (logged once, with why), each job makes its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import structlog

from workflow_engine.domain.held import Held
from workflow_engine.sandbox._at_fork import ClosedInChild

log = structlog.get_logger(__name__)

#: A received descriptor is moved to this number or above, clear of the 3 to 6 a wrapper
#: gets them on.
_LOWEST_FD = 10
#: The engine's ends of every helper's socket in this process: a forked child closes them, so
#: that a helper still reads end of file once the engine that started it is gone.
_helper_sockets: ClosedInChild[socket.socket] = ClosedInChild(socket.socket.close)


@dataclass
class _Held:
    """One task's namespaces: being made, then their descriptors (network first)."""

    made: asyncio.Task[tuple[int, ...]]
    used: float = field(default_factory=time.monotonic)
    closed: bool = False

    def close(self) -> None:
        self.closed = True
        if self.made.done():
            _close_made(self.made)
        else:
            self.made.add_done_callback(_close_made)


def _close_made(made: asyncio.Task[tuple[int, ...]]) -> None:
    if not made.cancelled() and made.exception() is None:
        for fd in made.result():
            os.close(fd)


class TaskNamespaces:
    """The namespaces of the tasks whose jobs a `JobRunner` started lately."""

    def __init__(self, jobwrap: str, *, idle_seconds: float = 30.0, most: int = 128) -> None:
        """`most`: sets held at once, one descriptor each (two for "userns"): twice the jobs
        an engine runs at once by default (`max_running_jobs`), well inside the 1,024
        descriptors a container is often allowed."""
        self._jobwrap = jobwrap
        self._idle_seconds = idle_seconds
        self._most = most
        self._held: OrderedDict[tuple[str, str], _Held] = OrderedDict()
        self._pid = os.getpid()
        self._helpers: dict[str, _Helper] = {}  # by isolation
        self._told: set[str] = set()  # the reasons they could not be made, logged once each

    def held(self) -> list[Held]:
        return [Held("sandbox.namespaces", len(self._held), self._most)]

    async def for_task(self, task_id: str, isolation: str) -> tuple[int, ...]:
        """Descriptors of the namespaces `task_id`'s jobs share (the network namespace, then
        for "userns" the user namespace), made at its first job; () if they cannot be made.

        They stay open until the caller's next suspension point at least: spawn right away.
        """
        if self._pid != os.getpid():  # a forked child: these are its parent's
            self._held, self._helpers = OrderedDict(), {}
            self._pid = os.getpid()
        key = (task_id, isolation)
        while True:
            self._let_go(time.monotonic())
            held = self._held.get(key)
            if held is None:
                held = _Held(asyncio.ensure_future(self._make(isolation)))
                self._held[key] = held
            self._held.move_to_end(key)
            held.used = time.monotonic()
            # Shielded: a job that stops waiting leaves them to the next job of the task.
            fds = await asyncio.shield(held.made)
            if held.closed:  # let go of while it was made: make (or take) the next one
                continue
            if not fds:
                self._held.pop(key, None)
            return fds

    def close(self) -> None:
        """Let go of every task's namespaces (a running job keeps its own)."""
        for held in self._held.values():
            held.close()
        self._held.clear()
        for helper in self._helpers.values():
            helper.close()
        self._helpers.clear()

    def _let_go(self, now: float) -> None:
        """Close the namespaces idle for `idle_seconds`, and the oldest beyond `most`."""
        while self._held:
            key, held = next(iter(self._held.items()))
            if len(self._held) <= self._most and now - held.used < self._idle_seconds:
                return
            del self._held[key]
            held.close()

    async def _make(self, isolation: str) -> tuple[int, ...]:
        """A new set of namespaces from this isolation's helper; () if it cannot make them."""
        helper = self._helpers.get(isolation)
        if helper is None or helper.gone:
            try:
                helper = self._helpers[isolation] = _Helper.start(self._jobwrap, isolation)
            except OSError as exc:
                return self._unavailable(f"{self._jobwrap} did not start: {exc}")
        said, fds = await helper.ask()
        expected = 2 if isolation == "userns" else 1
        if said == b"n" and len(fds) == expected:
            return fds
        for fd in fds:
            os.close(fd)
        return self._unavailable(said.decode(errors="replace").strip()[-300:] or "no answer")

    def _unavailable(self, reason: str) -> tuple[int, ...]:
        if reason not in self._told:
            self._told.add(reason)
            log.warning(
                "sandbox_task_namespaces_unavailable",
                reason=reason,
                effect="each job makes its own namespaces",
            )
        return ()


class _Helper:
    """A ``jobwrap --namespaces`` process: it makes a set of namespaces per request, in order."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.gone = False
        self._sock = sock
        self._waiting: deque[asyncio.Future[tuple[bytes, tuple[int, ...]]]] = deque()
        self._last_words = b"its helper is gone"  # or what it said unasked before it went
        _helper_sockets.add(sock)
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    @classmethod
    def start(cls, jobwrap: str, isolation: str) -> _Helper:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            try:
                pid = os.posix_spawn(
                    jobwrap,
                    [jobwrap, "--namespaces", isolation],
                    {},
                    file_actions=[
                        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                        (os.POSIX_SPAWN_DUP2, theirs.fileno(), 3),
                    ],
                    setsid=True,  # signals to the engine's process group are not for it
                )
            except OSError:
                ours.close()
                raise
        ours.setblocking(False)
        return cls(pid, ours)

    async def ask(self) -> tuple[bytes, tuple[int, ...]]:
        """Its answer to one request: the words, and the descriptors (moved clear of 3-5)."""
        answer: asyncio.Future[tuple[bytes, tuple[int, ...]]]
        answer = asyncio.get_running_loop().create_future()
        if self.gone:
            return self._last_words, ()
        self._waiting.append(answer)
        # It cannot fail but for a helper that is gone, whose end of file answers this.
        with contextlib.suppress(OSError):
            self._sock.send(b"n")
        return await answer

    def close(self) -> None:
        """Let it go: it reads end of file and exits (each namespace it made lives on)."""
        if self.gone:
            return
        self.gone = True
        with contextlib.suppress(ValueError, RuntimeError):  # a loop that is closed already
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
        _helper_sockets.discard(self._sock)
        self._sock.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)  # it exits at end of file, right away
        while self._waiting:
            answer = self._waiting.popleft()
            if not answer.done():
                answer.set_result((self._last_words, ()))

    def _readable(self) -> None:
        while True:
            try:
                said, received, _, _ = socket.recv_fds(self._sock, 4096, 2, socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                return
            except ConnectionResetError:
                # It exited with our request unread; what it sent before is still to read.
                continue
            except OSError:
                said, received = b"", []
            if not said and not received:  # end of file: it exited
                self.close()
                return
            try:
                fds = _moved_clear(received)
            except OSError as exc:  # out of descriptors, say: the job makes its own
                said, fds = f"cannot keep the namespaces it made: {exc}".encode(), ()
            answer = self._waiting.popleft() if self._waiting else None
            if answer is None or answer.done():  # unasked: why it is about to exit
                self._last_words = said or self._last_words
                for fd in fds:
                    os.close(fd)
            else:
                answer.set_result((said, fds))


def _moved_clear(received: list[int]) -> tuple[int, ...]:
    """`received` renumbered to `_LOWEST_FD` or above; none of them is left open on failure."""
    moved: list[int] = []
    try:
        for fd in received:
            moved.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _LOWEST_FD))
    except OSError:
        for fd in moved:
            os.close(fd)
        raise
    finally:
        for fd in received:
            os.close(fd)
    return tuple(moved)
