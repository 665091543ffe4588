"""A node's event says what it did in a line cut to a bound: secrets are masked before the cut,
so the cut never leaves a piece of one."""

from __future__ import annotations

from workflow_engine._masking import MASK, Secrets
from workflow_engine.graph._builder import describe

SECRET = "described-secret-0123456789"


def test_an_event_detail_is_masked_before_it_is_cut() -> None:
    secrets = Secrets()
    secrets.add([SECRET])
    for at in range(480, 500):
        _, detail = describe("mark_failed", {"error": "x" * at + SECRET}, {}, secrets)
        assert SECRET[:4] not in detail, at
    _, detail = describe("mark_failed", {"error": "x" * 480 + SECRET}, {}, secrets)
    assert detail.endswith(MASK)
    revision = {"step_id": "a", "error": "e", "reason": "r" * 1950 + SECRET}
    _, detail = describe("verify_step_result", {"revisions": [revision]}, {}, secrets)
    assert SECRET[:4] not in detail and detail.endswith(MASK)
