"""Moved to `tests.support.engine_process`; named here for `benchmarks/eval_model.py` until it
imports it from there."""

from tests.support.engine_process import ENGINE, EngineProcess

__all__ = ["ENGINE", "EngineProcess"]
