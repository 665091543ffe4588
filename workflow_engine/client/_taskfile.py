"""A task for `start`, from a YAML or JSON file (or stdin), as the contract's TaskSpec.

The document is a ``TaskSpec`` in the contract's JSON form (field names as in the ``.proto``
or in lowerCamelCase), e.g.::

    prompt: Check the service and report
    steps:
      - id: health
        command: [curl, -fsS, http://localhost:8080/healthz]
        expect: [{kind: stdout_contains, value: ok}]
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from google.protobuf import json_format

from workflow_engine.errors import UsageError
from workflow_engine.v1 import workflow_engine_pb2 as pb


def read_task(source: str) -> pb.TaskSpec:
    """The task in `source`: a path, or "-" for stdin. YAML reads JSON too."""
    where = "stdin" if source == "-" else source
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as exc:
        raise UsageError(f"task file: cannot read {where!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"task file: {where!r} is not UTF-8 text") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"task file: {where!r} is not YAML or JSON: {exc}") from None
    if not isinstance(document, dict):
        raise UsageError(f"task file: {where!r} must hold a task (a mapping with prompt, steps...)")
    try:
        return json_format.ParseDict(document, pb.TaskSpec())
    except json_format.ParseError as exc:
        raise UsageError(f"task file: {where!r}: {exc}") from None
