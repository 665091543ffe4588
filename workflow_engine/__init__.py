"""workflow-engine: a durable LangGraph workflow worker driven over gRPC.

The public surface is small: `Settings` to configure, `Engine` to run in-process, the gRPC
contract in `workflow_engine.v1`, and the exceptions in `workflow_engine.errors`.
"""

from workflow_engine.config import Settings

__all__ = ["Settings"]
__version__ = "0.1.0"
