"""Where the engine is and how to reach it: address, TLS and a bearer token.

The address defaults to the engine's own ``WORKFLOW_ENGINE_LISTEN`` (so a shell that starts
the engine can call it without flags), with a wildcard host read as this host's loopback.
TLS is on when a CA file, a client certificate or ``--tls`` is given; the token comes from
``--token-file`` or ``WORKFLOW_ENGINE_CLIENT_TOKEN`` (never a flag, which ``ps`` shows).

A token is a caller's whole authority, so it is not sent in clear beyond this host: without TLS,
an address whose host is neither loopback (``localhost``, 127.0.0.0/8, ``::1``), nor an
address of this host's interfaces, nor a unix socket is refused (a name is not resolved)
when there is a token to send, unless
``--allow-plaintext-remote`` (or ``WORKFLOW_ENGINE_CLIENT_ALLOW_PLAINTEXT_REMOTE=true``) says
the network is trusted, as the engine's own client of worker nodes refuses it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import grpc

from workflow_engine.config import ENV_PREFIX, Settings, is_loopback
from workflow_engine.errors import UsageError

TOKEN_ENV = f"{ENV_PREFIX}CLIENT_TOKEN"
ALLOW_PLAINTEXT_ENV = f"{ENV_PREFIX}CLIENT_ALLOW_PLAINTEXT_REMOTE"
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
        allow_plaintext_remote: bool = False,
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
        tls = tls or ca_file is not None or cert_file is not None
        allowed = allow_plaintext_remote or os.environ.get(ALLOW_PLAINTEXT_ENV, "") == "true"
        if token and not tls and not allowed and not _on_this_host(address):
            raise UsageError(
                f"--address: {address!r} is not this host's loopback, and the bearer token "
                f"would cross the network in clear; use --tls (or --ca-file), or "
                f"--allow-plaintext-remote where the network is trusted"
            )
        return cls(
            address=address,
            tls=tls,
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


def _on_this_host(address: str) -> bool:
    """Whether gRPC's target `address` reaches this host only: a unix socket, a loopback host,
    or an address of one of this host's interfaces (an engine listening on one; the kernel
    keeps such traffic off the network). ``dns:///`` and ``ipv4:``/``ipv6:`` prefixes are read
    through; a name is not resolved."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    target = address.removeprefix("dns:///").removeprefix("ipv4:").removeprefix("ipv6:")
    host = target.rpartition(":")[0]
    return is_loopback(host) or _an_address_of_this_host(host.strip("[]"))


def _an_address_of_this_host(host: str) -> bool:
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return False  # a name, or a list of addresses: not known to be here
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, 0))  # only an address of this host's can be bound
        except OSError:
            return False
    return not ipaddress.ip_address(host).is_unspecified


def _read(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{flag}: cannot read {str(path)!r}: {exc.strerror}") from None
