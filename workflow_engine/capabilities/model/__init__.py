"""A model over any OpenAI-compatible endpoint: planning, judging, and what it may run.

`model_client` speaks Chat Completions and asks for JSON (`structured_output` walks each
server's dialects, `answer_schemas` holds the shapes); `llm_planner` and `llm_verifier` are the
``llm`` planner and verifier; `command_policy` decides what a model-planned step may do.
"""
