"""One execution of a task's workflow in this process, from taking the lease to releasing it.

A `Run` steps through the workflow graph (`graph._builder.WorkflowGraph`) itself, from the
task's latest checkpoint: it runs one node, merges the node's update into the state, lets the
node's edge choose the next node, and writes the row (state, next node, the node's event) as one
fenced write (`storage._checkpointer`) before the next node starts. So every node is durable and
fenced before anything acts on it, and a run resumes exactly where the row says. This is what
LangGraph's loop does with a checkpointer and `durability="sync"`, without its per-step
machinery, which cost about half of the engine's CPU; the nodes still run with LangGraph's
runtime context, and the row keeps LangGraph's checkpoint format, which LangGraph's own loop
resumes (`tests/integration/graph/test_langgraph_resumes.py`).

Each node's body runs through `guard`, which stops the run at a node boundary or interrupts the
node. A heartbeat renews the lease every third of its time to live (`renewal_pause`, on the
engine's clock); a renewal that finds the lease gone stops the run before its next node.

Changes from outside (an approval decision, a raised budget, an operator's override; see
`workflow_engine.graph.changes`) are applied by the run that holds the lease: given at launch,
or submitted to a live run. A live run does not wait for its node to end: it interrupts the node
(every node is safe to run again, and a job it waits for keeps running and is re-attached by its
id), applies the change to its latest checkpoint, and carries on. Each change is computed from
the state it is applied to, so one that no longer fits is refused, never applied twice.

Once a run has written its final checkpoint (the workflow ended or paused; that write released
the lease) or has been told to stop, it is *closing*: it takes no more changes, and whoever has
one for the workflow waits for the run to end and claims the workflow afresh.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import psycopg
import structlog
from langgraph.runtime import Runtime
from opentelemetry import trace
from pydantic import ValidationError

from workflow_engine._context import EngineContext
from workflow_engine._masking import STATE_FIELD, accumulated, state_secrets
from workflow_engine.domain.records import Fence
from workflow_engine.domain.status import (
    FINAL_STATUSES,
    OUTSIDE_CHANGE,
    TERMINAL_STATUSES,
    WorkflowStatus,
)
from workflow_engine.domain.values import JsonObject, as_invalid_argument
from workflow_engine.errors import (
    CheckpointCorrupt,
    LeaseLost,
    OutsideWrite,
    RunEnded,
    RunStopped,
    UnreadableStateFormat,
    WorkflowEngineError,
)
from workflow_engine.graph import FIRST, NODE_EVENT, NodeContext, WorkflowGraph
from workflow_engine.graph.changes import CONTINUE_FROM, Change, apply_all
from workflow_engine.graph.state import WorkflowState, read_state
from workflow_engine.storage import (
    Checkpoint,
    Pool,
    RowCheckpointer,
    leases,
    on_connection,
    workflow_rows,
)
from workflow_engine.telemetry import tracing

log = structlog.get_logger(__name__)

T = TypeVar("T")

#: The reason a run stops (or is interrupted) to apply changes, then goes on.
UPDATE = "update"
#: A run renews its lease this many times per time to live, so a renewal or two may fail (the
#: database slow or away for a moment) before the lease expires.
RENEWALS_PER_TTL = 3


def renewal_pause(ttl_seconds: float) -> float:
    """How long the heartbeat waits after a renewal (or a failed one) before the next; also
    the longest one renewal may take. The lease's expiry itself is on the database's clock
    (`storage.leases`); the engine's clock only paces its renewal."""
    return ttl_seconds / RENEWALS_PER_TTL


class Run:
    """A live workflow run; see the module docstring."""

    def __init__(
        self,
        *,
        fence: Fence,
        ttl_seconds: float,
        status: str,
        graph: WorkflowGraph,
        checkpoints: RowCheckpointer,
        pool: Pool,
        initial_input: WorkflowState | None,
        context: EngineContext | None = None,
        changes: Sequence[Change] = (),
    ) -> None:
        context = EngineContext() if context is None else context
        self._clock = context.clock
        self._faults = context.faults
        self._secrets = context.secrets
        self._metrics = context.metrics
        self._lease_lost_counted = False  # the heartbeat and a write may both find it lost
        self._fence = fence
        self._ttl = ttl_seconds
        self._status = status
        self._graph = graph
        self._checkpoints = checkpoints
        self._pool = pool
        self._input = initial_input
        self._has_checkpoint = initial_input is None
        self._stop_reason: str | None = None
        self._closing = False
        self._released = False
        # Batches of changes to apply at the next node boundary, each with the future its
        # caller awaits (done with the state after the batch, once it is durable).
        self._batches: list[tuple[list[Change], asyncio.Future[WorkflowState]]] = []
        self._applying = False
        self._node_task: asyncio.Future[Any] | None = None
        self._interrupted: str | None = None
        if changes:
            self._batches.append((list(changes), asyncio.get_running_loop().create_future()))
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
        """True until the run has a checkpoint to read (it starts from its input)."""
        return not self._has_checkpoint

    @property
    def closing(self) -> bool:
        """True once the run takes no more changes (final checkpoint written, or stopping)."""
        return self._closing or self._stop_reason is not None

    async def guard(self, node: str, body: Awaitable[T]) -> T:
        """Run a node's body, unless the run must stop first; an interrupt abandons it.

        The body runs as its own task, so an interrupt (a change to apply, a cancel) cancels
        the node's work without touching the graph's machinery; the run then stops at this
        boundary, and the node runs again later if the workflow goes on.
        """
        try:
            self._check_boundary()
        except RunStopped:
            if asyncio.iscoroutine(body):
                body.close()
            raise
        task = asyncio.ensure_future(body)
        self._node_task = task
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if task.cancelled() and self._interrupted and not (me and me.cancelling()):
                raise RunStopped(self._fence.task_id, self._interrupted) from None
            raise
        finally:
            self._node_task = None

    def _written(self, checkpoint: Checkpoint[WorkflowState], node: str) -> None:
        """`node`'s checkpoint is durable: record its node and status."""
        self.last_node = node
        self._status = WorkflowStatus.of_state(checkpoint.state.get("status")).value
        self._has_checkpoint = True
        if self._status in FINAL_STATUSES:  # that write released the lease; nothing follows
            self._closing = self._released = True
            self._metrics.lease("released")
            if self._status in TERMINAL_STATUSES:
                self._metrics.workflow_finished(self._status, checkpoint.state.get("started_at"))

    def _check_boundary(self) -> None:
        if self._stop_reason is not None:
            raise RunStopped(self._fence.task_id, self._stop_reason)
        if self._batches and self._has_checkpoint and not self._applying:
            raise RunStopped(self._fence.task_id, UPDATE)

    # -- control --------------------------------------------------------------------------

    def submit(self, changes: Sequence[Change]) -> asyncio.Future[WorkflowState] | None:
        """Apply `changes` (in order, all or none) as soon as possible; `None` when closing.

        The future is done with the state after the changes once they are durable, or with
        the exception of the first change that refused the state it was given.
        """
        if self.closing:
            return None
        done: asyncio.Future[WorkflowState] = asyncio.get_running_loop().create_future()
        self._batches.append((list(changes), done))
        if self._has_checkpoint:
            self._interrupt(UPDATE)
        return done

    def pending(self) -> list[asyncio.Future[WorkflowState]]:
        """The futures of the changes not yet applied (e.g. given at launch), to await."""
        return [done for _, done in self._batches]

    def request_stop(self, reason: str, *, interrupt: bool = False) -> None:
        """Stop at the next node boundary, or at once (abandoning the node) with `interrupt`."""
        if self._stop_reason is None:
            self._stop_reason = reason
            log.info("run_stop_requested", reason=reason, interrupt=interrupt)
        if interrupt:
            self._interrupt(reason)

    def _interrupt(self, reason: str) -> None:
        self._interrupted = self._interrupted or reason
        if self._node_task is not None and not self._node_task.done():
            self._node_task.cancel()

    async def execute(self) -> str:
        """Drive the graph to its end or to a stop; return how it ended, for logs and tests."""
        structlog.contextvars.bind_contextvars(
            task_id=self._fence.task_id, run_id=self._fence.run_id
        )
        heartbeat = asyncio.create_task(self._heartbeat(), name=f"heartbeat-{self._fence.task_id}")
        release = True
        span = tracing.start_span(
            "workflow run",
            {
                "workflow_engine.task_id": self._fence.task_id,
                "workflow_engine.run_id": self._fence.run_id,
                "workflow_engine.holder_id": self._fence.holder_id,
            },
        )
        try:
            with trace.use_span(span, end_on_exit=False):
                await self._drive()
            self.outcome = self._status
            log.info("run_finished", status=self._status)
        except RunStopped as stop:
            self.outcome = f"stopped: {stop.reason}"
            log.info("run_stopped", reason=stop.reason, last_node=self.last_node)
        except LeaseLost:
            self.outcome = "lease lost"
            release = False
            self._count_lease_lost()
            log.warning("run_lease_lost", last_node=self.last_node)
        except OutsideWrite:
            # Another writer changed the row: nothing of this run is written over it. The
            # workflow waits for an operator (see `WorkflowService.accept_outside_state`).
            self.outcome = "blocked: changed outside the engine"
            log.warning("run_outside_write", last_node=self.last_node)
            await workflow_rows.block(self._pool, self._fence, OUTSIDE_CHANGE)
        except UnreadableStateFormat as exc:
            # A newer engine wrote the row: left as it is, for a replica that reads it.
            self.outcome = "left alone: newer state format"
            log.warning("run_unreadable_state_format", error=exc.message)
        except CheckpointCorrupt as exc:
            self.outcome = "failed: corrupt checkpoint"
            log.error("run_checkpoint_corrupt", error=exc.message)
            await workflow_rows.set_status(
                self._pool, self._fence, WorkflowStatus.FAILED, exc.message
            )
            self._metrics.workflow_finished(WorkflowStatus.FAILED, None)
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
            # The row says what kind of error, the log (masked with every secret the engine
            # knows) says the rest: the exception's words may quote a tenant's own, and a
            # mask from another workflow's secrets in them would answer a guess
            # (`secrets.for_workflow`).
            await workflow_rows.set_status(
                self._pool,
                self._fence,
                WorkflowStatus.FAILED,
                f"internal error after {self.last_node}: {type(exc).__name__} (the engine's log "
                "has its details)",
            )
            self._metrics.workflow_finished(WorkflowStatus.FAILED, None)
        finally:
            span.set_attribute("workflow_engine.outcome", self.outcome or "")
            span.end()
            self._closing = True
            heartbeat.cancel()
            for _, done in self._batches:  # never applied: the run ended first
                if not done.done():
                    done.set_exception(RunEnded(self._fence.task_id, self.outcome or ""))
            if release and not self._released:
                await asyncio.shield(self._release())
            structlog.contextvars.unbind_contextvars("task_id", "run_id")
        return self.outcome or ""

    async def _drive(self) -> None:
        """Step through the graph from the latest checkpoint, writing it after every node;
        apply submitted changes first and whenever they interrupt a node."""
        if self._input is not None:
            checkpoint = Checkpoint.fresh(self._input, FIRST)
        else:
            found = await self._checkpoints.read(self._fence.task_id, self._graph.nodes)
            if found is None:
                raise CheckpointCorrupt(
                    f"task {self._fence.task_id}: no checkpoint to resume from",
                    task_id=self._fence.task_id,
                )
            checkpoint = self._typed(found)
            self._secrets.add(state_secrets(checkpoint.state))
        runtime: Runtime[NodeContext | None] = Runtime(context=NodeContext(self))
        while True:
            if self._batches and self._has_checkpoint:
                checkpoint = await self._apply_changes(checkpoint)
            node = checkpoint.next_node
            if node is None:
                return
            started = time.perf_counter()
            with tracing.span(f"node {node}"):
                try:
                    update = await self._graph.nodes[node](checkpoint.state, runtime=runtime)
                except RunStopped as stop:
                    if stop.reason != UPDATE or self._stop_reason is not None:
                        raise
                    continue  # apply the changes, then run the node again
                finally:
                    self._interrupted = None
                event = update.pop(NODE_EVENT)
                checkpoint = self._advance(checkpoint, node, update)
                await self._checkpoints.write(self._fence, checkpoint, event)
            self._metrics.node_completed(node, time.perf_counter() - started)
            self._written(checkpoint, node)

    def _typed(self, found: Checkpoint[JsonObject]) -> Checkpoint[WorkflowState]:
        """The checkpoint read, its state checked against the state's form (once: the run keeps
        it typed from here); `CheckpointCorrupt` naming the first field that is not."""
        try:
            return found.with_state(read_state(found.state))
        except ValidationError as exc:
            wrong = as_invalid_argument(exc, "state")
            raise CheckpointCorrupt(
                f"task {self._fence.task_id}: the state is malformed ({wrong.message})",
                task_id=self._fence.task_id,
            ) from None

    def _advance(
        self, checkpoint: Checkpoint[WorkflowState], node: str, update: WorkflowState
    ) -> Checkpoint[WorkflowState]:
        state: WorkflowState = {**checkpoint.state, **update}
        # A plan that changed may have lost a secret: the state keeps it (a row from before
        # the field starts keeping its plan's at its first write).
        if "plan" in update or STATE_FIELD not in checkpoint.state:
            secrets = accumulated(checkpoint.state, state)
            if secrets is not None:
                state["secrets"] = secrets
                update = {**update, "secrets": secrets}
        if "plan" in update:  # its logs and errors must not show the plan's secrets
            self._secrets.add(state_secrets(state))
        return checkpoint.after(node, state, update, self._graph.next_node(node, state))

    async def _apply_changes(
        self, checkpoint: Checkpoint[WorkflowState]
    ) -> Checkpoint[WorkflowState]:
        """Apply the submitted batches in order, each update as its own checkpoint whose next
        node is chosen by `CONTINUE_FROM`'s router, as if that node had written it."""
        self._applying = True
        try:
            while self._batches:
                changes, done = self._batches.pop(0)
                try:
                    updates, _ = apply_all(changes, checkpoint.state)
                except WorkflowEngineError as refused:
                    if not done.done():
                        done.set_exception(refused)
                    continue
                try:
                    for update in updates:
                        event = {
                            "node": update.label,
                            "kind": update.kind,
                            "detail": update.detail,
                            "actor": update.actor,
                        }
                        after = self._advance(checkpoint, CONTINUE_FROM, update.values)
                        await self._checkpoints.write(self._fence, after, event)
                        checkpoint = after
                        self._written(checkpoint, update.label)
                        log.info(
                            "run_updated",
                            label=update.label,
                            detail=update.detail,
                            actor=update.actor,
                        )
                except BaseException as exc:
                    if not done.done():
                        done.set_exception(exc)
                    raise
                if not done.done():
                    done.set_result(checkpoint.state)
        finally:
            self._applying = False
        return checkpoint

    async def _release(self) -> None:
        try:
            fence = self._fence
            await on_connection(self._pool, lambda conn: leases.release(conn, fence))
            self._metrics.lease("released")
        except psycopg.Error as exc:  # it expires on its own; nothing else to do
            log.warning("lease_release_failed", error=repr(exc))

    def _count_lease_lost(self) -> None:
        """Count this run's lease as lost in the metrics, once."""
        if not self._lease_lost_counted:
            self._lease_lost_counted = True
            self._metrics.lease("lost")

    async def _heartbeat(self) -> None:
        interval = renewal_pause(self._ttl)
        while True:
            await self._clock.sleep(interval)
            try:
                self._faults.at("renew", "*")
                expires = await on_connection(
                    self._pool,
                    lambda conn: leases.renew(conn, self._fence, self._ttl),
                    max_seconds=interval,  # then the next beat tries again
                )
            except psycopg.Error as exc:
                log.warning("lease_renew_failed", error=repr(exc))
                continue
            if expires is None:
                self._count_lease_lost()
                self.request_stop("lease lost", interrupt=True)
                return
            self._metrics.lease("renewed")
