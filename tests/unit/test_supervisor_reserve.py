"""The supervisor's reservation of its address: its engines may share it, nothing else may.

`reserve` binds the address with SO_REUSEPORT for the supervisor's engines. Anything already on
it, even an engine of another supervisor (which binds it the same way), makes it refuse, naming
the setting, instead of sharing the port and the connections with a stranger.
"""

from __future__ import annotations

import socket

import pytest

from workflow_engine._supervisor import reserve
from workflow_engine.errors import AddressInUse


def _listening(reuse_port: bool) -> socket.socket:
    sock = socket.socket()
    if reuse_port:  # as gRPC binds an engine's port
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.parametrize("reuse_port", [True, False], ids=["another-supervisors-engine", "other"])
def test_an_address_in_use_is_refused_naming_the_setting(reuse_port: bool) -> None:
    with _listening(reuse_port) as holder:
        listen = f"127.0.0.1:{holder.getsockname()[1]}"
        named = f"WORKFLOW_ENGINE_LISTEN: cannot listen on {listen}"
        with pytest.raises(AddressInUse, match=named):
            reserve(listen)


def test_port_0_becomes_a_free_port_the_engines_can_share() -> None:
    reservation, address = reserve("127.0.0.1:0")
    with reservation:
        port = int(address.rsplit(":", 1)[1])
        assert port == reservation.getsockname()[1] != 0
        with socket.socket() as engine:  # an engine binds it as the supervisor did
            engine.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            engine.bind(("127.0.0.1", port))
            engine.listen()
        with pytest.raises(AddressInUse):  # and a second supervisor cannot
            reserve(address)


def test_a_port_the_last_run_left_in_time_wait_is_not_refused() -> None:
    # `make run`, Ctrl-C, `make run` again: the stopped engine closed its connections first,
    # so they wait out TIME_WAIT on the port for a minute; nothing listens there any more.
    with _listening(reuse_port=True) as old:
        port = old.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            served, _ = old.accept()
            served.close()  # the server's side closes first: its end goes to TIME_WAIT
            client.recv(1)
    reservation, address = reserve(f"127.0.0.1:{port}")
    with reservation:
        assert address == f"127.0.0.1:{port}"
