"""Checks of an issued certificate over a real TLS handshake: the chain served by a TLS server on loopback and
verified by Python's ``ssl`` against a given trust anchor (pebble's root of the run, or the system store)."""

from __future__ import annotations

import pathlib
import socket
import ssl
import threading

from cryptography import x509
from cryptography.x509.oid import NameOID

from corral.acme import Issued


def handshake(issued: Issued, host: str, client: ssl.SSLContext, base: pathlib.Path) -> str:
    """Serve ``issued`` on a loopback port and connect to it as ``host`` with ``client``: the issuer's CN of
    the leaf the client verified (raises ``ssl.SSLCertVerificationError`` when it does not verify)."""
    (base / "fullchain.pem").write_text(issued.fullchain_pem)
    (base / "key.pem").write_text(issued.key_pem)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(base / "fullchain.pem", base / "key.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError):
            pass  # the client refused the chain: its side raises

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            client.wrap_socket(raw, server_hostname=host) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            cn = x509.load_der_x509_certificate(der).issuer.get_attributes_for_oid(NameOID.COMMON_NAME)
            return str(cn[0].value)
    finally:
        thread.join(timeout=5)
        listener.close()


def trusting(root_pem: str) -> ssl.SSLContext:
    """A client context whose only trust anchor is ``root_pem``."""
    return ssl.create_default_context(cadata=root_pem)
