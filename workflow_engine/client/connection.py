"""Where the engine is and how to reach it: address, TLS and a bearer token.

The address defaults to the engine's own ``WORKFLOW_ENGINE_LISTEN`` (so a shell that starts
the engine can call it without flags), with a wildcard host read as this host's loopback.
TLS is on when a CA file, a client certificate or ``--tls`` is given; the token comes from
``--token-file`` or ``WORKFLOW_ENGINE_CLIENT_TOKEN`` (never a flag, which ``ps`` shows).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from workflow_engine.config import ENV_PREFIX, Settings
from workflow_engine.errors import UsageError

TOKEN_ENV = f"{ENV_PREFIX}CLIENT_TOKEN"
#: A listen address's wildcard host, and the host a client on this machine calls instead.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "": "127.0.0.1"}  # noqa: S104


def default_address(environ: dict[str, str] | None = None) -> str:
    """Where a local engine listens: its ``WORKFLOW_ENGINE_LISTEN``, wildcard host as loopback."""
    environ = dict(os.environ) if environ is None else environ
    listen = environ.get(f"{ENV_PREFIX}LISTEN") or Settings.__dataclass_fields__["listen"].default
    host, _, port = str(listen).rpartition(":")
    return f"{_WILDCARDS.get(host, host)}:{port}"


@dataclass(frozen=True, slots=True)
class Connection:
    """How the client reaches the engine."""

    address: str
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    token: str = ""

    @classmethod
    def from_flags(
        cls,
        address: str | None,
        *,
        tls: bool = False,
        ca_file: Path | None = None,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        token_file: Path | None = None,
    ) -> Connection:
        address = address or default_address()
        if address.rpartition(":")[2] in ("", "0"):
            raise UsageError(
                f"--address: {address!r} names no port (an engine on port 0 logs the one it "
                f"picked in its `serving` line); give --address HOST:PORT"
            )
        if (cert_file is None) != (key_file is None):
            raise UsageError(
                "--cert-file and --key-file: give both (a client certificate) or neither"
            )
        token = os.environ.get(TOKEN_ENV, "")
        if token_file is not None:
            token = _read(token_file, "--token-file").decode().strip()
        return cls(
            address=address,
            tls=tls or ca_file is not None or cert_file is not None,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
            token=token,
        )

    def channel(self) -> grpc.Channel:
        if not self.tls:
            return grpc.insecure_channel(self.address)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "--ca-file") if self.ca_file else None,
            private_key=_read(self.key_file, "--key-file") if self.key_file else None,
            certificate_chain=_read(self.cert_file, "--cert-file") if self.cert_file else None,
        )
        return grpc.secure_channel(self.address, credentials)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


def _read(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{flag}: cannot read {str(path)!r}: {exc.strerror}") from None
