"""``corral server`` binds before anything else; each way binding can fail is one sentence saying what to do."""

from __future__ import annotations

import socket

import pytest

from corral.server import PortUnavailable, bind_socket


def test_binds_and_listens_on_a_free_port() -> None:
    sock = bind_socket("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        sock.close()


def test_a_port_in_use_says_so_and_what_to_do() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortUnavailable) as e:
            bind_socket("127.0.0.1", port)
    assert str(e.value).startswith(f"Port {port} is already in use on 127.0.0.1")
    assert f"corral server --port {port + 1} (or CORRAL_SERVER_PORT={port + 1})" in str(e.value)


@pytest.mark.parametrize("host", ["192.0.2.1"])  # TEST-NET-1: on no machine
def test_an_address_not_of_this_machine_names_the_host_option(host: str) -> None:
    with pytest.raises(PortUnavailable) as e:
        bind_socket(host, 0)
    assert f"{host} is not an address of this machine. Choose another with --host." in str(e.value)


async def test_accepted_connections_get_tcp_nodelay() -> None:
    """As with a socket uvicorn binds itself: without it every response waits on Nagle's algorithm."""
    import asyncio

    seen: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            seen.append(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    sock = bind_socket("127.0.0.1", 0)
    server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
    finally:
        server.close()
    assert seen and seen[0] != 0
