"""The command-line client does not send a caller's token in clear beyond this host.

Attacker: anyone on the network between an operator's shell and the engine. The token is the
caller's whole authority (a scoped orchestrator's or an operator's); sent without TLS, whoever
reads the network may act as that caller. The client refuses, naming ``--address``, unless
told the network is trusted; the engine's client of worker nodes refuses the same way.

A listener on every interface of this host stands for the engine (and the eavesdropper): the
client is pointed at it by this host's name (not resolved: it could be anywhere), and the
listener must get no byte.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator

import pytest

TOKEN = "token-of-a-operator-0123456789abcdef"


def outward_host() -> str:
    """A name of this host's (which the client does not resolve to decide, and which reaches
    the listener if the client goes ahead): its host name, when that resolves."""
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, None)
    except OSError:
        pytest.skip(f"this host's name {name!r} does not resolve")
    return name


@pytest.fixture
async def eavesdropper() -> AsyncIterator[tuple[int, list[bytes]]]:
    """A TCP listener on every interface: its port, and what reached it."""
    heard: list[bytes] = []

    async def listen(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heard.append(await reader.read(65536))
        writer.close()

    server = await asyncio.start_server(listen, "0.0.0.0", 0)
    try:
        yield server.sockets[0].getsockname()[1], heard
    finally:
        server.close()
        await server.wait_closed()


async def client(*args: str, **env: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workflow_engine",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "WORKFLOW_ENGINE_CLIENT_TOKEN": TOKEN, **env},
    )
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_a_token_is_not_sent_in_clear_beyond_loopback(
    eavesdropper: tuple[int, list[bytes]],
) -> None:
    port, heard = eavesdropper
    address = f"{outward_host()}:{port}"
    code, err = await client("list", "--address", address)
    assert code == 2, err
    assert "--address" in err and "in clear" in err, err
    await asyncio.sleep(0.2)
    assert heard == [], heard
    # An address of another host's is refused the same way (before any connection).
    code, err = await client("list", "--address", f"203.0.113.7:{port}")
    assert code == 2 and "in clear" in err, err


async def test_told_the_network_is_trusted_the_client_calls(
    eavesdropper: tuple[int, list[bytes]],
) -> None:
    # The same call with the operator's consent reaches the listener (so the refusal above is
    # what kept the token off the network, not an address nobody listens on).
    port, heard = eavesdropper
    address = f"{outward_host()}:{port}"
    code, _ = await client("list", "--address", address, "--allow-plaintext-remote")
    assert code != 0  # the listener is no gRPC server
    for _ in range(50):
        if heard:
            break
        await asyncio.sleep(0.1)
    assert heard, "the client did not reach the listener"
