"""The ``nodes`` worker: runs each job on a worker node over the Worker API (HTTP).

`select_target` picks a node (`NodeRegistry`: labels, health, load, preferences), waiting up to
``WORKFLOW_ENGINE_NODES_WAIT_SECONDS`` for one to become eligible, and then fails the attempt
with the reason node by node. `dispatch_step` records the choice in state before anything is
sent, so `run` (in `collect_result`, also after a restart) always goes to the recorded node.

`run` is one synchronous ``POST {url}/v1/worker/jobs:run`` with the node's bearer token, read
with a timeout longer than the job's own. The node deduplicates by ``job_id``, so sending the
same job again (a retry, or a restarted engine) returns the running or finished job, never a
second run. Hence:

- a transport error or a 5xx answer is retried, same job id, with backoff, for up to
  ``WORKFLOW_ENGINE_NODES_RETRY_SECONDS`` from the first failure; after that the attempt fails
  as *lost* (unreachable node) or with the node's error. The step's retry budget then makes a
  new attempt, with a new job id, which may go to another node: the same attempt never does.
- a 4xx answer (400 problem document, 401, 413) is not retried: the attempt fails with the
  node's message.

An ``https://`` node's certificate must chain to the default CAs, or to those of
``WORKFLOW_ENGINE_NODES_CA_FILE`` (`client_tls`), and name the URL's host, before its token is
sent; an ``http://`` node beyond loopback is refused where the nodes are read
(`nodes_file.plaintext_refusal`) unless ``WORKFLOW_ENGINE_NODES_ALLOW_PLAINTEXT_REMOTE`` is set.

The nodes come from a nodes file (read once, at start-up) or from a source that is refreshed
(`refresh`, every ``WORKFLOW_ENGINE_NODES_REFRESH_SECONDS``: the orchestrator's nodes table,
`_nodes_table`): a node that joins is asked for its health at once and then gets jobs; one that
leaves gets no new jobs, but a job already recorded for it is still sent to it, with the URL and
token last read. A refresh that fails keeps the nodes as they were. A job recorded for a node
this engine has never known (it left before this engine started) is lost, with that reason.

Readiness comes from ``GET {url}/readyz``, polled in the background every
``WORKFLOW_ENGINE_NODES_HEALTH_INTERVAL_SECONDS``; a node a request could not reach counts as
not ready until its next good poll. `cancel` aborts the request in flight and asks the node to
stop the job (``POST {url}/v1/worker/jobs/{job_id}:cancel``, our node's extension; a 404 from a
node without it is fine).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self

import httpx2
import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    wait_exponential_jitter,
)

from workflow_engine.capabilities.workers import _worker_api as worker_api
from workflow_engine.capabilities.workers._nodes_file import WorkerNode
from workflow_engine.capabilities.workers._nodes_table import NodeList
from workflow_engine.capabilities.workers._registry import NodeRegistry
from workflow_engine.config import ENV_PREFIX, NodesSettings
from workflow_engine.domain.held import Held
from workflow_engine.domain.jobs import JobRequest, JobResult, JobStatus
from workflow_engine.domain.task import Step
from workflow_engine.errors import CapabilityConfigError, NoEligibleNode

log = structlog.get_logger(__name__)

#: How much longer than the job's own timeout the engine waits for a node's answer.
READ_MARGIN_SECONDS = 60.0
#: How long a cancel request to a node may take.
CANCEL_TIMEOUT_SECONDS = 5.0
#: Cancelled job ids remembered, so a later `run` of one returns its cancelled result.
_MAX_REMEMBERED = 10_000


class _Retry(Exception):
    """One try failed in a way the same job id may be sent again for (transport, 5xx)."""

    def __init__(self, message: str, *, unreachable: bool) -> None:
        super().__init__(message)
        self.message = message
        self.unreachable = unreachable


class _FailingFor:
    """Tenacity stop: give up once tries have failed for `seconds` since the first failure.

    Measured from the first failure, not from the first try: a long job's request may run for
    an hour before its node dies, and the retry budget is for the node's absence.
    """

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._since: float | None = None

    def __call__(self, state: RetryCallState) -> bool:
        now = state.outcome_timestamp or 0.0
        if self._since is None:
            self._since = now
        return now - self._since >= self._seconds


def client_tls(settings: NodesSettings) -> ssl.SSLContext | None:
    """The TLS context `https://` nodes are checked with: only the CAs of ``settings.ca_file``;
    None (unset): the HTTP client's default CAs. Raises `CapabilityConfigError` naming the
    setting when the file cannot be read."""
    if not settings.ca_file:
        return None
    try:
        return ssl.create_default_context(cafile=settings.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise CapabilityConfigError(
            f"{ENV_PREFIX}NODES_CA_FILE={settings.ca_file}: cannot load it as PEM CA "
            f"certificates ({exc})"
        ) from None


class HttpWorker:
    """`Worker` sending jobs to the configured worker nodes; see the module docstring."""

    def __init__(
        self,
        nodes: tuple[WorkerNode, ...],
        settings: NodesSettings,
        *,
        default_timeout_seconds: int = 3600,
        refresh: Callable[[], Awaitable[NodeList]] | None = None,
        source: str = "the nodes file",
    ) -> None:
        """`nodes` as they are, or, with `refresh`, the nodes it returns: at start-up (whose
        error stops the start) and every ``settings.refresh_seconds``. `source` names where
        they come from, in messages."""
        self._registry = NodeRegistry(nodes)
        self._settings = settings
        self._tls = client_tls(settings)  # an unreadable CA file stops the start here
        self._default_timeout_seconds = default_timeout_seconds
        self._refresh = refresh
        self._source = source
        self._http: httpx2.AsyncClient | None = None
        self._poller: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._reloaded = False
        self._requests: dict[str, asyncio.Task[JobResult]] = {}
        self._cancelled: OrderedDict[str, None] = OrderedDict()

    def held(self) -> list[Held]:
        return [
            Held("nodes.requests", len(self._requests)),
            Held("nodes.cancelled", len(self._cancelled), _MAX_REMEMBERED),
            *self._registry.held(),
        ]

    @property
    def registry(self) -> NodeRegistry:
        return self._registry

    async def __aenter__(self) -> Self:
        self._http = httpx2.AsyncClient(
            # One connection per job in flight: a request lasts as long as its job.
            limits=httpx2.Limits(max_connections=None, max_keepalive_connections=64),
            timeout=httpx2.Timeout(self._settings.connect_timeout_seconds),
            verify=True if self._tls is None else self._tls,
        )
        try:
            if self._refresh is not None:
                await self._reload(self._refresh)
            await self._poll_all()  # the first dispatch knows which nodes are ready
        except BaseException:
            await self._http.aclose()
            raise
        self._poller = asyncio.create_task(self._poll_forever(), name="worker-node-health")
        if self._refresh is not None:
            self._refresher = asyncio.create_task(
                self._refresh_forever(self._refresh), name="worker-node-refresh"
            )
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for task in (self._refresher, self._poller):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._http is not None:
            await self._http.aclose()

    def unfit(self, step: Step) -> tuple[str, str] | None:
        """A step whose `required_labels` no node has all of, when the nodes are the nodes
        file's (fixed while this engine runs). From a refreshed source (the orchestrator's
        table) every step may run: a node with its labels may join. Whether a node runs an
        image is for the node to say."""
        if self._refresh is not None or not step.required_labels:
            return None
        required = frozenset(step.required_labels)
        nodes = self._registry.nodes
        if any(required <= node.labels for node in nodes):
            return None
        return "required_labels", (
            f"no worker node in {self._source} has {', '.join(step.required_labels)[:200]} "
            f"({_labels_by_node(nodes)})"
        )

    async def select_target(self, job: JobRequest) -> str:
        """The eligible node for `job`, counted against its load from now; waits a bounded
        time for one, then raises `NoEligibleNode` saying why for each node."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.wait_seconds
        while True:
            node, why = self._registry.choose(job)
            if node is not None:
                self._registry.reserve(node.name, job.job_id)
                return node.name
            remaining = deadline - loop.time()
            if remaining <= 0:
                labels = ", ".join(job.required_labels) or "none"
                raise NoEligibleNode(
                    f"no worker node could take step {job.step_id or '?'} within "
                    f"{self._settings.wait_seconds:g} s (required labels: {labels}): {why}",
                    task_id=job.task_id,
                )
            await self._registry.wait_for_change(min(remaining, 1.0))

    async def run(self, target: str, job: JobRequest) -> JobResult:
        """Send `job` to `target` (the node recorded at dispatch) and return its result."""
        if job.job_id in self._cancelled:
            return _ended(job, target, "cancelled", "cancelled before it was sent")
        node = self._registry.node(target)
        if node is None:
            return _ended(
                job,
                target,
                "failed",
                f"job {job.job_id} was lost: it was sent to node {target!r}, which this engine "
                f"does not know ({self._source} no longer lists it); it is not sent elsewhere "
                "for the same job id",
            )
        self._registry.started(node.name, job.job_id)
        request = asyncio.create_task(self._send(node, job), name=f"job-{job.job_id}")
        self._requests[job.job_id] = request
        try:
            return await request
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if job.job_id in self._cancelled and not (current and current.cancelling()):
                return _ended(job, target, "cancelled", "cancelled: its request was aborted")
            raise
        finally:
            request.cancel()  # our caller stopped waiting: the request goes too
            self._requests.pop(job.job_id, None)
            self._registry.finished(node.name, job.job_id)

    async def cancel(self, target: str, job: JobRequest) -> None:
        """Abort the request in flight and ask the node to stop the job (see the module doc)."""
        self._cancelled[job.job_id] = None
        while len(self._cancelled) > _MAX_REMEMBERED:
            self._cancelled.popitem(last=False)
        request = self._requests.get(job.job_id)
        if request is not None:
            request.cancel()
        node = self._registry.node(target)
        if node is None or self._http is None:
            return
        try:
            response = await self._http.post(
                node.url + worker_api.cancel_path(job.job_id),
                headers=_auth(node),
                timeout=CANCEL_TIMEOUT_SECONDS,
            )
        except httpx2.HTTPError as exc:
            log.warning("node_cancel_failed", node=node.name, job_id=job.job_id, error=repr(exc))
            return
        if response.status_code in (404, 405):
            log.info("node_cancel_unsupported", node=node.name, job_id=job.job_id)
        elif response.is_error:
            message = worker_api.problem_message(
                response.status_code, response.reason_phrase, response.content
            )
            log.warning("node_cancel_refused", node=node.name, job_id=job.job_id, error=message)

    async def _send(self, node: WorkerNode, job: JobRequest) -> JobResult:
        assert self._http is not None, "HttpWorker used outside `async with`"
        timeout = job.sandbox.timeout_seconds or self._default_timeout_seconds
        body = worker_api.request_body(job, timeout)
        http_timeout = httpx2.Timeout(
            self._settings.connect_timeout_seconds,
            read=timeout + READ_MARGIN_SECONDS,
            pool=None,
        )
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_Retry),
            stop=_FailingFor(self._settings.retry_seconds),
            wait=wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.2),
            reraise=True,
        )
        tries = 0
        try:
            async for attempt in retrying:
                with attempt:
                    tries += 1
                    return await self._try(node, job, body, http_timeout, tries)
        except _Retry as failure:
            return self._gave_up(node, job, failure, tries)
        raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover

    async def _try(
        self,
        node: WorkerNode,
        job: JobRequest,
        body: dict[str, Any],
        http_timeout: httpx2.Timeout,
        tries: int,
    ) -> JobResult:
        assert self._http is not None
        log.info(
            "node_job_sent", node=node.name, job_id=job.job_id, step_id=job.step_id, try_=tries
        )
        try:
            response = await self._http.post(
                node.url + worker_api.RUN_PATH,
                json=body,
                headers=_auth(node),
                timeout=http_timeout,
            )
        except httpx2.TransportError as exc:
            reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
            if self._registry.set_health(node.name, False, f"a job request failed: {reason}"):
                log.warning("node_not_ready", node=node.name, reason=reason)
            log.warning("node_job_unanswered", node=node.name, job_id=job.job_id, error=reason)
            raise _Retry(reason, unreachable=True) from exc
        if response.status_code == 200:
            try:
                result = worker_api.read_result(job, node.name, response.json())
            except ValueError as exc:  # JSON that does not parse, or `UnreadableAnswer`
                log.warning("node_answer_unreadable", node=node.name, job_id=job.job_id)
                return _ended(
                    job, node.name, "failed", f"node {node.name} answered with no result: {exc}"
                )
            log.info("node_job_ended", node=node.name, job_id=job.job_id, status=result.status)
            return result
        message = worker_api.problem_message(
            response.status_code, response.reason_phrase, response.content
        )
        if response.status_code >= 500:
            log.warning("node_job_error", node=node.name, job_id=job.job_id, error=message)
            raise _Retry(message, unreachable=False)
        log.warning("node_job_refused", node=node.name, job_id=job.job_id, error=message)
        return _ended(job, node.name, "failed", f"node {node.name} refused the job: {message}")

    def _gave_up(self, node: WorkerNode, job: JobRequest, failure: _Retry, tries: int) -> JobResult:
        budget = f"{self._settings.retry_seconds:g} s, {tries} tries"
        if failure.unreachable:
            log.warning("node_job_lost", node=node.name, job_id=job.job_id, error=failure.message)
            stderr = (
                f"job {job.job_id} was lost: node {node.name} did not answer ({budget}; last: "
                f"{failure.message}); it is not run again for the same job id"
            )
        else:
            stderr = f"node {node.name} failed the job ({budget}): {failure.message}"
        return _ended(job, node.name, "failed", stderr)

    async def _refresh_forever(self, refresh: Callable[[], Awaitable[NodeList]]) -> None:
        while True:
            await asyncio.sleep(self._settings.refresh_seconds)
            try:
                await self._reload(refresh)
            except Exception as exc:  # the database is away: keep the nodes as they are
                log.warning(
                    "worker_nodes_refresh_failed",
                    source=self._source,
                    error=f"{type(exc).__name__}: {exc}",
                )

    async def _reload(self, refresh: Callable[[], Awaitable[NodeList]]) -> None:
        """Read the nodes again; those that joined are asked for their health at once."""
        listed = await refresh()
        joined, left = self._registry.update(listed.nodes, listed.unusable)
        if joined or left:
            log.info(
                "worker_nodes_changed",
                source=self._source,
                joined=joined,
                left=left,
                nodes=len(listed.nodes),
                unusable=dict(listed.unusable),
            )
        if not listed.nodes and (left or not self._reloaded):
            log.warning(
                "worker_nodes_none_usable", source=self._source, unusable=dict(listed.unusable)
            )
        self._reloaded = True
        if joined and self._http is not None:
            fresh = [node for node in listed.nodes if node.name in joined]
            await asyncio.gather(*(self._poll(node) for node in fresh))

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._settings.health_interval_seconds)
            await self._poll_all()

    async def _poll_all(self) -> None:
        await asyncio.gather(*(self._poll(node) for node in self._registry.nodes))

    async def _poll(self, node: WorkerNode) -> None:
        assert self._http is not None
        timeout = min(self._settings.health_interval_seconds, 10.0)
        try:
            response = await self._http.get(node.url + worker_api.READY_PATH, timeout=timeout)
        except httpx2.HTTPError as exc:
            ready, reason = False, f"readyz unreachable: {type(exc).__name__}"
        else:
            ready = response.status_code == 200
            reason = "" if ready else f"readyz {response.status_code}: {response.text[:100]}"
        if self._registry.set_health(node.name, ready, reason.strip()):
            log.info("node_readiness_changed", node=node.name, ready=ready, reason=reason)


def _auth(node: WorkerNode) -> dict[str, str]:
    return {"Authorization": f"Bearer {node.token}"}


def _ended(job: JobRequest, target: str, status: JobStatus, stderr: str) -> JobResult:
    """The result of a job that did not run to an exit here: no exit code, the reason."""
    return JobResult.unrun(job, status, stderr, target=target)


def _labels_by_node(nodes: tuple[WorkerNode, ...], shown: int = 10) -> str:
    """Each node's labels, for a message: "a has cpu, linux; b has none" (the first `shown`)."""
    parts = [f"{n.name} has {', '.join(sorted(n.labels)) or 'none'}" for n in nodes[:shown]]
    more = f"; and {len(nodes) - shown} more node(s)" if len(nodes) > shown else ""
    return ("; ".join(parts) + more)[:1000] or "it lists no nodes"
