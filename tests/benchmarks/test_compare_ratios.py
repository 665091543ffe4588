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


def test_target_rows_take_the_median_of_rounds_and_say_whether_it_is_met(compare: Any) -> None:
    engine, peer = compare.EngineGrpcCommand.name, compare.ServedPeer.name
    in_process, bare = compare.EngineInProcess.name, compare.LangGraphPostgres.name
    results = [
        # c=20, three rounds: 2.5, 3.2 and 3.1; the median (3.1) meets 3.0, the first does not.
        {**row(engine, 100.0, 1), "concurrency": 20},
        {**row(peer, 40.0, 1), "concurrency": 20},
        {**row(peer, 30.0, 2), "concurrency": 20},
        {**row(engine, 96.0, 2), "concurrency": 20},
        {**row(engine, 93.0, 3), "concurrency": 20},
        {**row(peer, 30.0, 3), "concurrency": 20},
        # c=1, two rounds: 3.0 and 1.0; the median (2.0) misses 2.5, the first would meet it.
        {**row(engine, 30.0, 1), "concurrency": 1},
        {**row(peer, 10.0, 1), "concurrency": 1},
        {**row(engine, 10.0, 2), "concurrency": 1},
        {**row(peer, 10.0, 2), "concurrency": 1},
        # In-process at exactly its target: met.
        row(in_process, 200.0, 1),
        row(bare, 50.0, 1),
    ]

    rows = compare.target_rows(results)

    # No row for what was not measured: c=100, the outcome-only pair, in-process at c=1.
    assert [(r["contender"], r["peer"], r["concurrency"]) for r in rows] == [
        (engine, peer, 1),
        (engine, peer, 20),
        (in_process, bare, 20),
    ]
    assert [(r["ratio"], r["rounds"], r["target"], r["met"]) for r in rows] == [
        (2.0, [3.0, 1.0], 2.5, False),
        (3.1, [2.5, 3.2, 3.1], 3.0, True),
        (4.0, [4.0], 4.0, True),
    ]


def node_row(name: str, round_: int, p50: float | None, p99: float | None) -> dict[str, Any]:
    return {**row(name, 1.0, round_), "node_p50_ms": p50, "node_p99_ms": p99}


def test_added_node_latency_is_the_median_of_each_rounds_difference(compare: Any) -> None:
    engine, peer = compare.EngineGrpcCommand.name, compare.ServedPeer.name
    outcome = compare.EngineGrpcCommandOutcome.name
    results = [
        node_row(engine, 1, 2.0, 5.0),
        node_row(peer, 1, 3.0, 9.0),
        node_row(outcome, 1, None, None),  # an outcome-only watch sees no node
        node_row(engine, 2, 2.5, 6.0),
        node_row(peer, 2, 2.0, 4.0),
        node_row(engine, 3, 4.0, 20.0),
        node_row(peer, 3, 3.5, 10.0),
        # Skipped: a round without the engine's node figures, one without the peer's, and
        # rounds that ran one of the two alone.
        node_row(engine, 4, None, None),
        node_row(peer, 4, 100.0, 100.0),
        node_row(engine, 5, 100.0, 100.0),
        node_row(peer, 5, None, None),
        node_row(engine, 6, 100.0, 100.0),
        node_row(peer, 7, 100.0, 100.0),
        # At c=1 neither has node figures: no row.
        {**node_row(engine, 1, None, None), "concurrency": 1},
        {**node_row(peer, 1, None, None), "concurrency": 1},
    ]

    (latency,) = compare.added_node_latency(results)

    # The median of the differences (0.5 and 2.0), not the difference of the medians (-0.5
    # and -3.0): each round's pair ran on the machine as it was then.
    assert latency == {
        "concurrency": 20,
        "rounds": 3,
        "engine_p50_ms": 2.5,
        "peer_p50_ms": 3.0,
        "added_p50_ms": 0.5,
        "engine_p99_ms": 6.0,
        "peer_p99_ms": 9.0,
        "added_p99_ms": 2.0,
    }


def test_logged_statements_are_counted_after_the_offset_only(
    compare: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "log"
    before = "2026-11-28 00:56:18.874 UTC [14103] LOG:  statement: SELECT 0\n"
    log.write_text(before)
    with log.open("a") as out:
        out.write(
            "2026-11-28 00:56:19.001 UTC [14110] LOG:  statement: BEGIN\n"
            "2026-11-28 00:56:19.002 UTC [14110] LOG:  execute <unnamed>: INSERT INTO t\n"
            "\tVALUES ($1)\n"  # the statement's next line: the same statement
            "2026-11-28 00:56:19.002 UTC [14110] DETAIL:  parameters: $1 = 'statement: x'\n"
            "2026-11-28 00:56:19.003 UTC [14110] LOG:  execute _pg3_0: SELECT 1\n"
            "2026-11-28 00:56:19.004 UTC [14110] ERROR:  duplicate key value\n"
            "2026-11-28 00:56:19.004 UTC [14110] STATEMENT:  INSERT INTO t VALUES (1)\n"
            "2026-11-28 00:56:19.005 UTC [14110] LOG:  duration: 0.2 ms  statement: SELECT 1\n"
            "2026-11-28 00:56:19.006 UTC [14112] LOG:  checkpoint starting: time\n"
            "2026-11-28 00:56:19.007 UTC [14110] LOG:  statement: COMMIT\n"
        )
    monkeypatch.setattr(compare, "SERVER_LOG", log)
    monkeypatch.setattr(compare.time, "sleep", lambda seconds: None)

    assert compare.count_logged_statements(len(before)) == 4
    assert compare.count_logged_statements(0) == 5
    assert compare.count_logged_statements(log.stat().st_size) == 0
