#!/usr/bin/env python3
"""Start a throwaway `corral server` and run `check_yaml_corpus.py` against its plan endpoints.

Every configuration in dstack's accepted corpus must get neither a 422 nor a 5xx; every rejected one a 422.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_REFERENCE_DIR = HERE.parent / "tests" / "data" / "dstack-yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reference-dir", default=str(DEFAULT_REFERENCE_DIR))
    args = parser.parse_args()
    port = free_port()
    token = "corpus-check-token"
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "CORRAL_SERVER_DIR": f"{tmp}/server",
            "CORRAL_CONFIG_DIR": f"{tmp}/cli",
            "CORRAL_SERVER_ADMIN_TOKEN": token,
            "CORRAL_BACKGROUND_PROCESSING": "0",
        }
        server = subprocess.Popen(
            [sys.executable, "-m", "corral.cli.main", "server", "--port", str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthcheck", timeout=1)
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        print(server.stdout.read().decode() if server.stdout else "", file=sys.stderr)
                        print("the corral server did not start", file=sys.stderr)
                        return 1
                    time.sleep(0.1)
            return subprocess.call(
                [
                    sys.executable,
                    str(HERE / "check_yaml_corpus.py"),
                    "--reference-dir",
                    args.reference_dir,
                    "--url",
                    f"http://127.0.0.1:{port}",
                    "--token",
                    token,
                ]
            )
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()


if __name__ == "__main__":
    sys.exit(main())
