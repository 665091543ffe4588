"""How `make bench` turns rounds of measurements into the ratios it prints: the 2.5x target's
pairs take the median of their rounds, everything else (and the plot) the first round."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def compare(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # compare.py imports its sibling modules
    import compare

    return compare


def row(name: str, rate: float, round_: int) -> dict[str, Any]:
    return {"contender": name, "concurrency": 20, "workflows_per_s": rate, "round": round_}


def test_target_ratio_is_the_median_of_rounds_and_the_rest_round_one(compare: Any) -> None:
    langgraph = compare.LangGraphPostgresCommand.name
    grpc = compare.EngineGrpcCommand.name
    results = [
        row(compare.BASELINE, 50.0, 1),
        row(langgraph, 10.0, 1),
        row(grpc, 20.0, 1),
        # Rounds 2 and 3 measure the target's contenders alone, in alternating order.
        row(grpc, 40.0, 2),
        row(langgraph, 10.0, 2),
        row(langgraph, 10.0, 3),
        row(grpc, 25.0, 3),
    ]
    target = f"{grpc} / {langgraph} @ c=20"

    assert compare.rounds_of_ratios(results)[target] == [2.0, 4.0, 2.5]
    ratios = compare.ratios(results)
    # The median: neither the first round (2.0) nor the mean (2.83).
    assert ratios[target] == 2.5
    # Ratios to contender 1 read the first round only: 20 / 50, not the later 40 or 25.
    assert ratios[f"{grpc} / langgraph+saver @ c=20"] == 0.4
    assert [r["workflows_per_s"] for r in compare.first(results)] == [50.0, 10.0, 20.0]
