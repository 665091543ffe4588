"""Choosing a worker node: labels, then readiness, then room, then load, then preferences."""

from __future__ import annotations

from workflow_engine.capabilities.workers._nodes_file import WorkerNode
from workflow_engine.capabilities.workers._registry import NodeRegistry
from workflow_engine.domain import JobRequest, Sandbox


def node(name: str, *labels: str, max_jobs: int = 2) -> WorkerNode:
    return WorkerNode(
        name=name, url=f"http://{name}", token="t", labels=frozenset(labels), max_jobs=max_jobs
    )


def job(job_id: str, required: tuple[str, ...] = (), preferred: tuple[str, ...] = ()) -> JobRequest:
    return JobRequest(
        task_id="t",
        job_id=job_id,
        sandbox=Sandbox(command=("true",)),
        required_labels=required,
        preferred_labels=preferred,
    )


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def ready(registry: NodeRegistry) -> NodeRegistry:
    for n in registry.nodes:
        registry.set_health(n.name, True)
    return registry


def test_only_a_node_with_every_required_label_is_chosen() -> None:
    registry = ready(NodeRegistry([node("a", "cpu"), node("b", "gpu", "locality=eu")]))
    chosen, _ = registry.choose(job("j", required=("gpu", "locality=eu")))
    assert chosen is not None and chosen.name == "b"
    none, why = registry.choose(job("j", required=("tpu",)))
    assert none is None and why == "a lacks tpu; b lacks tpu"


def test_a_node_not_ready_or_full_is_passed_over_and_the_reason_given() -> None:
    registry = ready(NodeRegistry([node("a", max_jobs=1), node("b")]))
    registry.set_health("b", False, "readyz 503: draining")
    registry.reserve("a", "j1")
    none, why = registry.choose(job("j2"))
    assert none is None
    assert why == "a is full (1/1 jobs); b is not ready (readyz 503: draining)"
    registry.finished("a", "j1")
    chosen, _ = registry.choose(job("j2"))
    assert chosen is not None and chosen.name == "a"


def test_the_least_loaded_share_wins_then_preferences_then_the_name() -> None:
    registry = ready(NodeRegistry([node("a", max_jobs=4), node("b", max_jobs=2), node("c")]))
    registry.reserve("a", "j1")  # a: 1/4, b: 0/2, c: 0/2
    chosen, _ = registry.choose(job("x"))
    assert chosen is not None and chosen.name == "b"  # b and c tie on load: by name
    chosen, _ = registry.choose(job("x", preferred=("locality=eu",)))
    assert chosen is not None and chosen.name == "b"
    registry = ready(
        NodeRegistry([node("a", max_jobs=4), node("b", max_jobs=2), node("c", "locality=eu")])
    )
    chosen, _ = registry.choose(job("x", preferred=("locality=eu",)))
    assert chosen is not None and chosen.name == "c"  # all idle: the preferred one
    registry.reserve("c", "j1")
    chosen, _ = registry.choose(job("x", preferred=("locality=eu",)))
    assert chosen is not None and chosen.name == "a"  # load comes before preference


def test_a_reservation_lapses_unless_its_request_starts() -> None:
    clock = Clock()
    registry = ready(NodeRegistry([node("a")], clock=clock, reservation_seconds=10))
    registry.reserve("a", "j1")
    registry.reserve("a", "j2")
    registry.started("a", "j2")
    assert registry.load("a") == 2
    clock.now += 11
    assert registry.load("a") == 1  # j1 was never sent; j2's request is under way
    registry.reserve("a", "j2")  # selected again (a dispatch that ran again): counted once
    assert registry.load("a") == 1


def test_nodes_that_join_wait_for_health_and_those_that_leave_get_no_new_jobs() -> None:
    registry = ready(NodeRegistry([node("a"), node("b")]))
    registry.reserve("a", "j1")
    joined, left = registry.update([node("b"), node("c")], {"a": "status 'drained'"})
    assert (joined, left) == (["c"], ["a"])
    assert [n.name for n in registry.nodes] == ["b", "c"]
    registry.set_health("b", False, "readyz 503: draining")
    none, why = registry.choose(job("j2"))
    assert none is None
    assert why == (
        "a is not usable (status 'drained'); b is not ready (readyz 503: draining); "
        "c is not ready (not asked yet)"
    )
    # The node that left is still known, with its load, for the job recorded for it.
    left_node = registry.node("a")
    assert left_node is not None and left_node.url == "http://a"
    assert registry.load("a") == 1
    registry.update([])
    assert registry.choose(job("j3")) == (None, "there are no worker nodes")
