"""A model over any OpenAI-compatible endpoint: planning, judging, and what it may run.

`_client` speaks Chat Completions and asks for JSON (`_structured_output` walks each server's
dialects, `answer_schemas` holds the shapes); `_planner` and `_verifier` are the ``llm``
planner and verifier; `_command_policy` decides what a model-planned step may do.

What the factory, the graph and the job verifier use (`__all__`): the client and its call
ledger, the planner and verifier with the helpers the graph's nodes share with them, the policy
loader, and the module `answer_schemas`.
"""

from workflow_engine.capabilities.model import answer_schemas
from workflow_engine.capabilities.model._client import Ledger, ModelClient, recording
from workflow_engine.capabilities.model._command_policy import PolicyDecision, load_policy
from workflow_engine.capabilities.model._planner import (
    LlmPlanner,
    PolicedPlan,
    describe_workers,
    policy_note,
)
from workflow_engine.capabilities.model._verifier import (
    LlmVerifier,
    checked_brief,
    combine,
    verification_brief,
)

__all__ = [
    "Ledger",
    "LlmPlanner",
    "LlmVerifier",
    "ModelClient",
    "PolicedPlan",
    "PolicyDecision",
    "answer_schemas",
    "checked_brief",
    "combine",
    "describe_workers",
    "load_policy",
    "policy_note",
    "recording",
    "verification_brief",
]
