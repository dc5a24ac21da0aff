"""Command line of the gateway process.

    python3 -I corral-gateway.pyz serve --state-dir DIR --management 127.0.0.1:PORT --token-file FILE
                                        [--http ADDR:80] [--https ADDR:443]
    python -m corral.gateway serve ...      (the same, from a checkout)

``--management`` must be a loopback address (the server reaches it over its SSH connection to the host);
``--http``/``--https`` default to every address's :80 and :443, ``off`` turns one off. Logs go to stderr.
SIGTERM or SIGINT: stop accepting, let open requests finish (10 s at most), exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import platform
import sys
from typing import Optional

import corral

from .app import serve
from .live import Gateway

log = logging.getLogger("corral.gateway")


def _address(text: str, flag: str, loopback: bool = False) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{flag} {text!r} must be ADDRESS:PORT (e.g. 127.0.0.1:8090)")
    if loopback:
        try:
            ok = ipaddress.ip_address(host.strip("[]")).is_loopback
        except ValueError:
            ok = host == "localhost"
        if not ok:
            raise argparse.ArgumentTypeError(f"{flag} {text!r} must be a loopback address (127.0.0.1:PORT)")
    return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="corral-gateway", description="corral's gateway process")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve :80, :443 and the management API")
    s.add_argument("--state-dir", required=True, help="where the state and certificates are kept")
    s.add_argument(
        "--management",
        required=True,
        type=lambda t: _address(t, "--management", loopback=True),
        help="the management API's loopback ADDRESS:PORT",
    )
    s.add_argument("--token-file", required=True, help="a file holding the management API's bearer token")
    s.add_argument("--http", default="0.0.0.0:80", help="ADDRESS:PORT of plain HTTP (default 0.0.0.0:80; off: none)")
    s.add_argument("--https", default="0.0.0.0:443", help="ADDRESS:PORT of HTTPS (default 0.0.0.0:443; off: none)")
    return parser


def _listen(value: str, flag: str) -> Optional[str]:
    return None if value == "off" else _address(value, flag)


def _raise_open_files() -> None:
    """Every client takes a descriptor and every forwarded request one more: lift the soft limit on open files to
    the hard one (dstack's gateway needed the same: its issue #3984, fixed with LimitNOFILE=65535)."""
    try:
        import resource
    except ImportError:  # not a Unix
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open files limit from %d to %d: %s", soft, hard, e)


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s corral-gateway %(message)s")
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        http, https = _listen(args.http, "--http"), _listen(args.https, "--https")
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    try:
        with open(args.token_file) as f:
            token = f.read().strip()
    except OSError as e:
        log.error("cannot read the token file: %s", e)
        return 2
    if not token:
        log.error("the token file %s is empty", args.token_file)
        return 2
    _raise_open_files()
    gw = Gateway(args.state_dir, token)
    try:
        for problem in gw.load():
            log.warning("%s", problem)
    except (OSError, ValueError) as e:
        log.error("cannot load the state directory: %s", e)
        return 2
    log.info(
        "corral gateway %s (Python %s); state from %s: %d services, %d entrypoints, %d certificates",
        getattr(corral, "__version__", "unknown"),
        platform.python_version(),
        args.state_dir,
        len(gw.state.services),
        len(gw.state.entrypoints),
        len(gw.contexts),
    )
    return asyncio.run(serve(gw, args.management, http, https))
