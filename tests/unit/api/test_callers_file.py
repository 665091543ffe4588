"""The tokens file: each mistake is refused at start-up with the entry and field named."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from workflow_engine.api._auth import Callers
from workflow_engine.errors import AuthConfigError

TOKEN = "a-token-of-enough-length"


def load(tmp_path: Path, doc: Any) -> Callers:
    path = tmp_path / "tokens.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    path.chmod(0o600)  # plaintext tokens: the engine's alone (tests/security/test_secret_files)
    return Callers.load(str(path))


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("{not json", "cannot read it as JSON"),
        ({"callers": []}, "one or more"),
        ({"callers": ["x"]}, r"callers\[0\]: expected an object"),
        ({"callers": [{"identity": "a", "role": "admin", "token": TOKEN}]}, r"\.role: expected"),
        ({"callers": [{"role": "reader", "token": TOKEN}]}, r"callers\[0\]\.identity: required"),
        ({"callers": [{"identity": "a", "role": "reader"}]}, "exactly one of token"),
        (
            {"callers": [{"identity": "a", "role": "reader", "token": TOKEN, "certificate": "c"}]},
            "exactly one of token",
        ),
        ({"callers": [{"identity": "a", "role": "reader", "token": "short"}]}, "16 characters"),
        (
            {"callers": [{"identity": "a", "role": "reader", "token_sha256": "abc"}]},
            "64 hex digits",
        ),
        (
            {"callers": [{"identity": "a", "role": "reader", "token": TOKEN, "tenant": "x"}]},
            r"unknown field\(s\) \['tenant'\]",
        ),
        (
            {"callers": [{"identity": "a", "role": "reader", "token": TOKEN, "projects": []}]},
            r"\.projects: name one or more",
        ),
        (
            {"callers": [{"identity": "a", "role": "reader", "token": TOKEN, "users": "bob"}]},
            r"\.users: expected a list",
        ),
    ],
)
def test_a_malformed_file_is_refused_naming_the_field(
    tmp_path: Path, doc: Any, message: str
) -> None:
    with pytest.raises(AuthConfigError, match=message) as refused:
        load(tmp_path, doc)
    assert "WORKFLOW_ENGINE_TOKENS_FILE" in str(refused.value)


def test_tokens_plain_or_hashed_name_their_caller(tmp_path: Path) -> None:
    hashed = hashlib.sha256(b"another-token-long-enough").hexdigest()
    callers = load(
        tmp_path,
        {
            "callers": [
                {"identity": "a", "role": "reader", "token": TOKEN},
                {"identity": "b", "role": "operator", "token_sha256": hashed},
                {"identity": "c", "role": "orchestrator", "certificate": "c.example"},
            ]
        },
    )
    assert callers.by_token(TOKEN) is not None and callers.by_token(TOKEN).name == "a"  # type: ignore[union-attr]
    found = callers.by_token("another-token-long-enough")
    assert found is not None and (found.name, found.role) == ("b", "operator")
    assert callers.by_token(TOKEN + "x") is None
    assert callers.by_token(hashed) is None  # the hash itself opens nothing
    found = callers.by_certificate("c.example")
    assert found is not None and found.role == "orchestrator"
