"""How much of something each caller or tenant holds at once, and the refusal of one more.

A `Quota` counts, by key (a tenant's project, a caller's identity), what is held in this
process (running workflows, open watches); `take` refuses one more at the limit with
`ResourceExhausted` naming the setting, before anything is stored or started. A limit of 0
refuses nothing; counting goes on regardless, which costs a dict entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import structlog

from workflow_engine.errors import ResourceExhausted

log = structlog.get_logger(__name__)


class Quota:
    """Counts what each key holds, up to `limit` (0: no limit) refused by `take`.

    `setting` is the limit's variable, `holder` what a key is ("caller"; or `shown`, how a key
    is named) and `what` what is counted ("running workflows"), for the refusal's message.
    """

    def __init__(
        self,
        limit: int,
        *,
        setting: str,
        holder: str = "",
        what: str,
        shown: Callable[[str], str] | None = None,
    ) -> None:
        self.limit = limit
        self._setting = setting
        self._shown = shown or (lambda key: f"{holder} {key!r}")
        self._what = what
        self._held: dict[str, int] = {}

    def held(self, key: str) -> int:
        return self._held.get(key, 0)

    def holders(self) -> int:
        """How many keys hold any (a key is dropped when it gives its last back)."""
        return len(self._held)

    def take(self, key: str) -> None:
        """Count one more for `key`, or refuse it (`ResourceExhausted`) at the limit."""
        if self.limit and self.held(key) >= self.limit:
            log.info("quota_refused", setting=self._setting, key=key, held=self.held(key))
            raise ResourceExhausted(
                self._setting,
                f"{self._shown(key)} has {self.limit} {self._what} in this engine process, "
                "the most it may; retry when one ends",
            )
        self.add(key)

    def add(self, key: str) -> None:
        """Count one more for `key`, whatever the limit (work that is already the key's)."""
        self._held[key] = self.held(key) + 1

    def give_back(self, key: str) -> None:
        left = self._held[key] - 1
        if left:
            self._held[key] = left
        else:
            del self._held[key]

    @contextmanager
    def holding(self, key: str) -> Iterator[None]:
        """`take` one for `key` for the block's duration."""
        self.take(key)
        try:
            yield
        finally:
            self.give_back(key)
