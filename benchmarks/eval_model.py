"""How often a model's plan works: the engine's ``llm`` planner and verifier on a fixed set of
tasks written in plain words (`benchmarks/model_tasks.json`), through a served engine.

An evaluation, not a test: it prints a table (plans valid on the first try, after a repair
turn, workflows SUCCEEDED, model calls and tokens per workflow, seconds per workflow), writes
it as JSON and plots it (``bench-results/eval-model.{json,png}``). Each task's criterion is a
machine check the engine runs on the final step's result, so SUCCEEDED means the task was done
(and the model's judge agreed, with ``--verifier llm``).

Without ``--base-url`` it serves SmolLM2-135M-Instruct with llama-cpp-python's server, or
llama.cpp's with ``--server llama-server`` (`tests.support.llama_server`; ``make eval-model`` builds
them). With one, it runs unchanged against any
OpenAI-compatible endpoint::

    make eval-model ARGS="--base-url http://127.0.0.1:11434/v1 --model qwen2.5:7b"
    make eval-model ARGS="--base-url https://api.openai.com/v1 --model gpt-4o-mini \\
        --api-key-env OPENAI_API_KEY"

The engine uses an embedded PostgreSQL in a temporary directory unless ``--database-url`` is
given, and runs the jobs in its local sandbox under a command policy that allows the usual
shell tools (`POLICY`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.engine_process import EngineProcess  # noqa: E402
from tests.support.helpers import new_task_id, wait_for_status  # noqa: E402
from tests.support.llama_server import SERVERS  # noqa: E402
from workflow_engine.v1 import workflow_engine_pb2 as pb  # noqa: E402
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc  # noqa: E402

TASKS = ROOT / "benchmarks" / "model_tasks.json"
OUT = ROOT / "bench-results"
TERMINAL = {pb.SUCCEEDED, pb.FAILED, pb.CANCELLED, pb.SUSPENDED, pb.WAITING_FOR_APPROVAL}
#: The programs a plan may run unasked; anything else waits for approval (counted as such).
POLICY = {
    "allow": [
        *("sh", "bash", "echo", "printf", "cat", "ls", "mkdir", "touch", "cp", "mv", "gzip"),
        *("wc", "sort", "rev", "tr", "expr", "date", "uname", "pwd", "nproc", "head", "tail"),
        *("grep", "seq", "test", "true", "env", "python3", "awk", "sed", "cut", "bc", "find"),
    ],
    "default": "approve",
}


@dataclass
class Outcome:
    """One task's run."""

    task: str
    status: str
    plan: str  # first-try, repaired, none
    calls: int
    tokens: int
    seconds: float
    error: str


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="", help="an OpenAI-compatible endpoint (…/v1)")
    parser.add_argument("--model", default="", help="the model's name at that endpoint")
    parser.add_argument("--api-key-env", default="", help="the variable holding its API key")
    parser.add_argument(
        "--server",
        default="llama-cpp-python",
        choices=sorted(SERVERS),
        help="without --base-url: which local server serves SmolLM2-135M-Instruct",
    )
    parser.add_argument("--profile", default="full", choices=["full", "small"])
    parser.add_argument("--verifier", default="llm", choices=["llm", "checks"])
    parser.add_argument("--tasks", type=Path, default=TASKS)
    parser.add_argument("--limit", type=int, default=0, help="run only the first N tasks")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per workflow")
    parser.add_argument("--database-url", default="", help="default: an embedded PostgreSQL")
    parser.add_argument("--out", type=Path, default=OUT / "eval-model")
    return parser.parse_args()


async def run_task(
    stub: pb_grpc.WorkflowEngineStub, task: dict[str, Any], seconds_allowed: float
) -> Outcome:
    criterion = task["criterion"]
    spec = pb.TaskSpec(
        prompt=task["prompt"],
        acceptance_criteria=[
            pb.AcceptanceCriterion(
                description=criterion["description"], check=pb.Check(**criterion["check"])
            )
        ],
    )
    task_id = new_task_id()
    started = time.monotonic()
    await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    try:
        wf = await wait_for_status(stub, task_id, TERMINAL, timeout=seconds_allowed)
    except (TimeoutError, AssertionError):
        await stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=task_id, reason="eval timeout"))
        wf = await wait_for_status(stub, task_id, TERMINAL, timeout=60)
    seconds = time.monotonic() - started
    state = json_format.MessageToDict(wf.state)
    calls = state.get("model_calls", [])
    plan_calls = sum(1 for c in calls if c.get("purpose") == "plan")
    made = bool(state.get("plan", {}).get("steps"))
    return Outcome(
        task=task["id"],
        status=pb.WorkflowStatus.Name(wf.status),
        plan="none" if not made else "first-try" if plan_calls <= 1 else "repaired",
        calls=len(calls),
        tokens=int(state.get("model_tokens", 0)),
        seconds=round(seconds, 1),
        error=wf.error[:160],
    )


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    n = len(outcomes) or 1
    return {
        "tasks": len(outcomes),
        "plans_valid_first_try": sum(o.plan == "first-try" for o in outcomes),
        "plans_valid_after_repair": sum(o.plan == "repaired" for o in outcomes),
        "no_valid_plan": sum(o.plan == "none" for o in outcomes),
        "succeeded": sum(o.status == "SUCCEEDED" for o in outcomes),
        "model_calls_per_workflow": round(sum(o.calls for o in outcomes) / n, 2),
        "tokens_per_workflow": round(sum(o.tokens for o in outcomes) / n),
        "seconds_per_workflow": round(sum(o.seconds for o in outcomes) / n, 1),
    }


def table(outcomes: list[Outcome], totals: dict[str, Any], about: dict[str, str]) -> str:
    lines = [
        " ".join(f"{k}={v}" for k, v in about.items()),
        f"{'task':<14} {'status':<22} {'plan':<10} {'calls':>5} {'tokens':>7} "
        f"{'seconds':>8}  error",
    ]
    for o in outcomes:
        lines.append(
            f"{o.task:<14} {o.status:<22} {o.plan:<10} {o.calls:>5} {o.tokens:>7} "
            f"{o.seconds:>8.1f}  {o.error[:70]}"
        )
    n = totals["tasks"]
    lines += [
        "",
        f"plans valid on the first try  {totals['plans_valid_first_try']}/{n}",
        f"plans valid after repair      {totals['plans_valid_after_repair']}/{n}",
        f"workflows SUCCEEDED           {totals['succeeded']}/{n}",
        f"model calls per workflow      {totals['model_calls_per_workflow']}",
        f"tokens per workflow           {totals['tokens_per_workflow']}",
        f"seconds per workflow          {totals['seconds_per_workflow']}",
    ]
    return "\n".join(lines)


def plot(
    outcomes: list[Outcome], totals: dict[str, Any], about: dict[str, str], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"SUCCEEDED": "#2a9d4b", "FAILED": "#c0392b", "WAITING_FOR_APPROVAL": "#e0a800"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), width_ratios=[3, 1])
    left.bar(
        [o.task for o in outcomes],
        [o.seconds for o in outcomes],
        color=[colours.get(o.status, "#888888") for o in outcomes],
    )
    left.set_ylabel("seconds per workflow")
    left.set_title("each task (green: SUCCEEDED, red: FAILED, amber: waits for approval)")
    left.tick_params(axis="x", rotation=70, labelsize=8)
    n = totals["tasks"]
    names = ["plan 1st try", "plan repaired", "SUCCEEDED"]
    values = [
        totals["plans_valid_first_try"],
        totals["plans_valid_after_repair"],
        totals["succeeded"],
    ]
    right.bar(names, values, color=["#4a7ab8", "#8fb0d8", "#2a9d4b"])
    right.set_ylim(0, n)
    right.set_title(f"of {n} tasks")
    right.tick_params(axis="x", rotation=30)
    fig.suptitle(
        f"make eval-model: {about['model']} ({about['server']}, profile {about['profile']})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


async def evaluate(args: argparse.Namespace) -> int:
    tasks = json.loads(args.tasks.read_text())["tasks"]
    tasks = tasks[: args.limit] if args.limit else tasks
    llama = None
    if not args.base_url:
        llama = SERVERS[args.server](log=Path(tempfile.gettempdir()) / "eval-model-server.log")
        base_url, model, server = llama.base_url, llama.model, llama.version()
    else:
        base_url, model, server = args.base_url, args.model, args.base_url
    if not model:
        print("--model: required with --base-url", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="eval-model-", dir="/var/tmp") as scratch:
        policy = Path(scratch) / "policy.json"
        policy.write_text(json.dumps(POLICY))
        env = {
            "WORKFLOW_ENGINE_PLANNER": "llm",
            "WORKFLOW_ENGINE_VERIFIER": args.verifier,
            "WORKFLOW_ENGINE_LLM_BASE_URL": base_url,
            "WORKFLOW_ENGINE_LLM_MODEL": model,
            "WORKFLOW_ENGINE_LLM_PROFILE": args.profile,
            "WORKFLOW_ENGINE_LLM_TIMEOUT_SECONDS": "300",
            "WORKFLOW_ENGINE_COMMAND_POLICY_FILE": str(policy),
        }
        if args.api_key_env:
            env["WORKFLOW_ENGINE_LLM_API_KEY"] = os.environ.get(args.api_key_env, "")
        engine = EngineProcess(
            db_url=args.database_url or None,
            data_dir=Path(scratch) / "data",
            holder_id="eval-model",
            extra_env=env,
        )
        outcomes: list[Outcome] = []
        try:
            async with grpc.aio.insecure_channel(engine.address) as channel:
                stub = pb_grpc.WorkflowEngineStub(channel)
                for task in tasks:
                    outcome = await run_task(stub, task, args.timeout)
                    print(f"  {outcome.task}: {outcome.status} ({outcome.seconds} s)", flush=True)
                    outcomes.append(outcome)
        finally:
            engine.terminate()
            if llama is not None:
                llama.stop()
    about = {"model": model, "server": server, "profile": args.profile, "verifier": args.verifier}
    totals = summary(outcomes)
    print(table(outcomes, totals, about))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"about": about, "summary": totals, "tasks": [asdict(o) for o in outcomes]}
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    plot(outcomes, totals, about, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(evaluate(arguments())))
