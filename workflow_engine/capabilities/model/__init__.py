"""A model over any OpenAI-compatible endpoint: planning, judging, and what it may run.

`model_client` speaks Chat Completions and asks for JSON (`structured_output` walks each
server's dialects, `answer_schemas` holds the shapes); `llm_planner` and `llm_verifier` are the
``llm`` planner and verifier; `command_policy` decides what a model-planned step may do.

What the factory, the graph and the job verifier use (`__all__`): the client and its call
ledger, the planner and verifier, the policy loader, and `answer_schemas`. `structured_output`
is internal.
"""

from workflow_engine.capabilities.model import _answer_schemas as answer_schemas
from workflow_engine.capabilities.model._client import Ledger, ModelClient, recording
from workflow_engine.capabilities.model._command_policy import load_policy
from workflow_engine.capabilities.model._planner import LlmPlanner, describe_workers
from workflow_engine.capabilities.model._verifier import (
    LlmVerifier,
    combine,
    verification_brief,
)

__all__ = [
    "Ledger",
    "LlmPlanner",
    "LlmVerifier",
    "ModelClient",
    "answer_schemas",
    "combine",
    "describe_workers",
    "load_policy",
    "recording",
    "verification_brief",
]
