"""Where the client commands call, and what they refuse before calling anyone."""

from __future__ import annotations

from pathlib import Path

import pytest

from workflow_engine.client._connection import Connection, default_address
from workflow_engine.errors import UsageError


@pytest.mark.parametrize(
    ("listen", "address"),
    [
        (None, "127.0.0.1:50051"),
        ("0.0.0.0:7000", "127.0.0.1:7000"),
        ("[::]:7000", "[::1]:7000"),
        ("engine.internal:7000", "engine.internal:7000"),
    ],
)
def test_the_default_address_is_the_engines_own_listen_address(
    listen: str | None, address: str
) -> None:
    environ = {} if listen is None else {"WORKFLOW_ENGINE_LISTEN": listen}
    assert default_address(environ) == address


def test_what_cannot_work_is_refused_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--address: '127\.0\.0\.1:0' names no port"):
        Connection.from_flags("127.0.0.1:0")
    with pytest.raises(UsageError, match="--cert-file and --key-file"):
        Connection.from_flags("h:1", cert_file=tmp_path / "c.pem")
    with pytest.raises(UsageError, match="--token-file: cannot read"):
        Connection.from_flags("h:1", token_file=tmp_path / "absent")


def test_a_token_is_sent_as_bearer_metadata_and_tls_follows_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORKFLOW_ENGINE_CLIENT_TOKEN", raising=False)
    assert Connection.from_flags("h:1").metadata() == ()
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    connection = Connection.from_flags("h:1", token_file=token, ca_file=tmp_path / "ca.pem")
    assert connection.metadata() == (("authorization", "Bearer s3cret-token"),)
    assert connection.tls
