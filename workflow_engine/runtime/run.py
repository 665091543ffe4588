"""One execution of a task's workflow in this process, from taking the lease to releasing it.

A `Run` drives the compiled graph and is also what the graph's nodes and the checkpointer talk
to during the run (through the run config): it says which node just completed, whether the run
must stop at this node boundary, and which lease (holder, epoch) every write is fenced with. A
heartbeat renews the lease every third of its time to live; a renewal that finds the lease gone
stops the run before its next node.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import structlog
from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph

from workflow_engine.errors import CheckpointCorrupt, LeaseLost, RunStopped
from workflow_engine.graph.state import WorkflowState
from workflow_engine.runtime.faults import FaultPlan
from workflow_engine.storage.checkpointer import RUN_CONTEXT_KEY
from workflow_engine.storage.leases import Fence
from workflow_engine.storage.workflows import TERMINAL_STATUSES, WorkflowStore

log = structlog.get_logger(__name__)


class Run:
    """A live workflow run; see the module docstring."""

    def __init__(
        self,
        *,
        fence: Fence,
        ttl_seconds: float,
        status: str,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        store: WorkflowStore,
        initial_input: WorkflowState | None,
        faults: FaultPlan | None = None,
    ) -> None:
        self._faults = faults or FaultPlan()
        self._fence = fence
        self._ttl = ttl_seconds
        self._status = status
        self._graph = graph
        self._store = store
        self._input = initial_input
        self._completed_node: str | None = None
        self._stop_reason: str | None = None
        self.last_node: str | None = None
        self.outcome: str | None = None

    # -- what the checkpointer and the nodes see -------------------------------------------

    @property
    def fence(self) -> Fence:
        return self._fence

    @property
    def status(self) -> str:
        return self._status

    @property
    def fresh(self) -> bool:
        return self._input is not None

    def node_started(self, node: str) -> None:
        if self._stop_reason is not None:
            raise RunStopped(self._fence.task_id, self._stop_reason)

    def node_finished(self, node: str) -> None:
        self._completed_node = node

    def take_completed_node(self) -> str | None:
        node, self._completed_node = self._completed_node, None
        return node

    def checkpoint_written(self, node: str, status: str) -> None:
        self.last_node = node
        self._status = status
        if self._stop_reason is not None and status not in TERMINAL_STATUSES:
            raise RunStopped(self._fence.task_id, self._stop_reason)

    # -- control --------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Stop at the next node boundary (after the current node's checkpoint is written)."""
        if self._stop_reason is None:
            self._stop_reason = reason
            log.info("run_stop_requested", reason=reason)

    async def execute(self) -> str:
        """Drive the graph to its end or to a stop; return how it ended, for logs and tests."""
        structlog.contextvars.bind_contextvars(
            task_id=self._fence.task_id, run_id=self._fence.run_id
        )
        heartbeat = asyncio.create_task(self._heartbeat(), name=f"heartbeat-{self._fence.task_id}")
        release = True
        try:
            config: RunnableConfig = {
                "configurable": {"thread_id": self._fence.task_id, RUN_CONTEXT_KEY: self},
                "recursion_limit": 10_000,
            }
            await self._graph.ainvoke(self._input, config, durability="sync")
            self.outcome = self._status
            log.info("run_finished", status=self._status)
        except RunStopped as stop:
            self.outcome = f"stopped: {stop.reason}"
            log.info("run_stopped", reason=stop.reason, last_node=self.last_node)
        except LeaseLost:
            self.outcome = "lease lost"
            release = False
            log.warning("run_lease_lost", last_node=self.last_node)
        except CheckpointCorrupt as exc:
            self.outcome = "failed: corrupt checkpoint"
            log.error("run_checkpoint_corrupt", error=exc.message)
            await self._store.set_status(self._fence, "FAILED", exc.message)
        except psycopg.Error as exc:
            # The database stayed unreachable beyond the retry budget. The workflow is not
            # failed: its checkpoint is intact and a resume continues from it.
            self.outcome = "database unavailable"
            log.error("run_database_error", error=repr(exc))
        except asyncio.CancelledError:
            self.outcome = "cancelled mid-node"
            log.warning("run_cancelled_mid_node", last_node=self.last_node)
            raise
        except Exception as exc:
            self.outcome = "failed: internal error"
            log.exception("run_internal_error")
            await self._store.set_status(
                self._fence, "FAILED", f"internal error after {self.last_node}: {exc!r}"
            )
        finally:
            heartbeat.cancel()
            if release:
                await asyncio.shield(self._release())
            structlog.contextvars.unbind_contextvars("task_id", "run_id")
        return self.outcome or ""

    async def _release(self) -> None:
        try:
            await self._store.release_lease(self._fence)
        except psycopg.Error as exc:  # it expires on its own; nothing else to do
            log.warning("lease_release_failed", error=repr(exc))

    async def _heartbeat(self) -> None:
        interval = self._ttl / 3
        while True:
            await asyncio.sleep(interval)
            try:
                self._faults.at("renew", "*")
                expires = await self._store.renew_lease(self._fence, self._ttl)
            except psycopg.Error as exc:
                log.warning("lease_renew_failed", error=repr(exc))
                continue
            if expires is None:
                self.request_stop("lease lost")
                return
