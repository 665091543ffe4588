"""One execution of a task's workflow in this process, from taking the lease to releasing it.

A `Run` drives the compiled graph and is also what the graph's nodes and the checkpointer talk
to during the run (through the run config): it says which node just completed, whether the run
must stop at this node boundary, and which lease (holder, epoch) every write is fenced with. A
heartbeat renews the lease every third of its time to live; a renewal that finds the lease gone
stops the run before its next node.

Changes from outside (an approval decision, a raised budget, an operator's override; see
`workflow_engine.graph.commands`) are applied by the run that holds the lease: given at launch,
or handed to a live run, which applies it at its next node boundary and carries on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import structlog
from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph

from workflow_engine.errors import CheckpointCorrupt, InvalidState, LeaseLost, RunStopped
from workflow_engine.graph.commands import CONTINUE_FROM, StateUpdate
from workflow_engine.graph.state import WorkflowState
from workflow_engine.runtime.faults import FaultPlan
from workflow_engine.storage.checkpointer import RUN_CONTEXT_KEY, NodeEvent
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
        updates: Sequence[StateUpdate] = (),
        on_end: Callable[[str], None] | None = None,
    ) -> None:
        self._faults = faults or FaultPlan()
        self._fence = fence
        self._ttl = ttl_seconds
        self._status = status
        self._graph = graph
        self._store = store
        self._input = initial_input
        self._completed_node: NodeEvent | None = None
        self._stop_reason: str | None = None
        self._on_end = on_end
        # Updates to apply at the next node boundary, each with the future its caller awaits.
        self._updates: list[tuple[StateUpdate, asyncio.Future[None]]] = []
        self._applying = False
        for update in updates:
            self._updates.append((update, asyncio.get_running_loop().create_future()))
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

    def node_finished(self, node: str, kind: str, detail: str) -> None:
        self._completed_node = NodeEvent(node, kind, detail)

    def take_completed_node(self) -> NodeEvent | None:
        node, self._completed_node = self._completed_node, None
        return node

    def checkpoint_written(self, node: str, status: str) -> None:
        self.last_node = node
        self._status = status
        if status in TERMINAL_STATUSES:
            return
        if self._stop_reason is not None:
            raise RunStopped(self._fence.task_id, self._stop_reason)
        if self._updates and not self._applying:
            raise RunStopped(self._fence.task_id, "update")

    # -- control --------------------------------------------------------------------------

    def request_update(self, update: StateUpdate) -> asyncio.Future[None]:
        """Apply `update` at the next node boundary; the future is done once it is durable."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._updates.append((update, done))
        return done

    def withdraw_update(self, done: asyncio.Future[None]) -> bool:
        """Take back an update not applied yet; False if it already was (or is being)."""
        for i, (_, pending) in enumerate(self._updates):
            if pending is done:
                del self._updates[i]
                return True
        return False

    def pending_updates(self) -> list[asyncio.Future[None]]:
        """The futures of the updates not yet applied (e.g. given at launch), to await."""
        return [done for _, done in self._updates]

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
            await self._drive(config)
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
            for _, done in self._updates:  # never applied: the run ended first
                if not done.done():
                    done.set_exception(InvalidState(f"the run ended ({self.outcome}) first"))
            if release:
                await asyncio.shield(self._release())
            if self._on_end is not None:
                self._on_end(self._fence.task_id)
            structlog.contextvars.unbind_contextvars("task_id", "run_id")
        return self.outcome or ""

    async def _drive(self, config: RunnableConfig) -> None:
        """Run the graph; apply pending updates first and at every node boundary they stop."""
        graph_input: WorkflowState | None = self._input
        while True:
            if self._updates:
                await self._apply_updates(config)
                graph_input = None
            try:
                await self._graph.ainvoke(graph_input, config, durability="sync")
                return
            except RunStopped as stop:
                if stop.reason != "update" or self._stop_reason is not None:
                    raise
            self._input = None  # later passes continue from the checkpoint

    async def _apply_updates(self, config: RunnableConfig) -> None:
        self._applying = True
        try:
            await self._apply_each(config)
        finally:
            self._applying = False

    async def _apply_each(self, config: RunnableConfig) -> None:
        while self._updates:
            update, done = self._updates.pop(0)
            try:
                self._completed_node = NodeEvent(
                    update.label, update.kind, update.detail, update.actor
                )
                await self._graph.aupdate_state(config, update.values, as_node=CONTINUE_FROM)
            except BaseException as exc:
                if not done.done():
                    done.set_exception(exc)
                raise
            if not done.done():
                done.set_result(None)
            log.info("run_updated", label=update.label, detail=update.detail, actor=update.actor)

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
