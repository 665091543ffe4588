"""`api._limits`: every list and map a request can hold has a limit, counted before anything is
converted, at no cost per element of a list over its limit."""

from __future__ import annotations

import time

import pytest
from google.protobuf.descriptor import Descriptor

from tests.support.helpers import step, struct, task
from workflow_engine.api._limits import COUNTED, JSON_BYTES, JSON_LISTS, counted
from workflow_engine.errors import InvalidArgument
from workflow_engine.v1 import workflow_engine_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["WorkflowEngine"]


def repeated_fields(descriptor: Descriptor, seen: set[str]) -> set[str]:
    """Every list and map field in messages of `descriptor`'s type, at any depth."""
    if descriptor.full_name in seen:
        return set()
    seen.add(descriptor.full_name)
    found = set()
    for field in descriptor.fields:
        if field.is_repeated:
            found.add(field.full_name)
        if field.message_type is not None:
            found |= repeated_fields(field.message_type, seen)
    return found


def test_every_list_and_map_of_every_request_has_a_limit() -> None:
    """A field added to a request without a limit fails here."""
    seen: set[str] = set()
    lists = set().union(*(repeated_fields(m.input_type, seen) for m in SERVICE.methods))
    assert lists - JSON_LISTS <= set(COUNTED), sorted(lists - JSON_LISTS - set(COUNTED))
    assert lists >= JSON_LISTS
    singular = set(COUNTED) - lists  # a Struct's keys
    assert singular == {"workflow_engine.v1.UpdateWorkflowRequest.set_state"}


def test_the_first_list_over_its_limit_is_named_by_its_path() -> None:
    request = pb.StartWorkflowRequest(
        task=task(step("a", "true"), step("b", "true", env={f"V{i}": "x" for i in range(257)}))
    )
    with pytest.raises(InvalidArgument) as refused:
        counted(request)
    assert str(refused.value) == "task.steps[1].env: more than 256 variables"


def test_elements_are_counted_json_by_its_bytes_and_counting_can_stop_early() -> None:
    layer = struct({"k": [1, 2, {"n": None}]})
    request = pb.StartWorkflowRequest(task=task(step("a", "echo", "x"), preferences=[layer]))
    # steps 1, command 2, preferences 1, and as many JSON elements as the layer's bytes can hold
    elements = 4 + layer.ByteSize() // JSON_BYTES
    assert counted(request) == elements
    assert counted(request, stop_after=elements) == elements
    assert counted(request, stop_after=elements - 1) is None


@pytest.mark.timing
def test_a_list_over_its_limit_costs_nothing_per_element() -> None:
    request = pb.StartWorkflowRequest(task=pb.TaskSpec(steps=[pb.Step()] * 1_000_000))
    started = time.perf_counter()
    with pytest.raises(InvalidArgument, match=r"^task\.steps: more than 500 steps$"):
        counted(request)
    assert time.perf_counter() - started < 0.01
