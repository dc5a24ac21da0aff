#!/usr/bin/env python3
"""Check corral's configuration parser (or a running server) against dstack's YAML corpus.

The corpus is `dstack-yaml-corpus.json` (configurations dstack 0.22.5 accepts) and
`dstack-yaml-rejected.json` (ones it rejects with 422), each a list of `{"source", "config"}`, in
`tests/data/dstack-yaml/` (taken from dstack's documentation; MPL-2.0, see the NOTICE there) unless
`--reference-dir` names another directory.

Default mode parses every configuration with `corral.config.parse_configuration` and reports
counts and each failure. HTTP mode (`--url URL --token TOKEN [--project main]`) posts each one to
the server's plan endpoint for its type, with the standard library only: accepted ones must
answer neither 422 nor 5xx (a 400 is fine, e.g. a missing backend), rejected ones must answer 422.

Exit status: 0 when every accepted configuration passes and every rejected one is rejected.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REFERENCE_DIR = REPO_ROOT / "tests" / "data" / "dstack-yaml"
RUN_TYPES = ("task", "service", "dev-environment")


def load_corpus(reference_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    accepted = json.loads((reference_dir / "dstack-yaml-corpus.json").read_text())
    rejected = json.loads((reference_dir / "dstack-yaml-rejected.json").read_text())
    return accepted, rejected


def check_local(conf: dict[str, Any]) -> str | None:
    """None if corral parses `conf`, else the one-line-per-problem error text."""
    if str(REPO_ROOT / "src") not in sys.path:
        sys.path.insert(0, str(REPO_ROOT / "src"))
    from pydantic import ValidationError

    from corral.config import format_validation_error, parse_configuration

    try:
        parse_configuration(conf)
    except ValidationError as e:
        return "; ".join(format_validation_error(e))
    return None


def plan_request(conf: dict[str, Any], project: str) -> tuple[str, dict[str, Any]]:
    """The endpoint path and body that submit `conf` for planning (volumes: creation)."""
    kind = conf.get("type")
    base = f"/api/project/{project}"
    if kind in RUN_TYPES:
        return f"{base}/runs/get_plan", {"run_spec": {"configuration": conf}}
    if kind == "fleet":
        return f"{base}/fleets/get_plan", {"spec": {"configuration": conf, "profile": {}}}
    if kind == "gateway":
        return f"{base}/gateways/get_plan", {"spec": {"configuration": conf}}
    if kind == "volume":
        return f"{base}/volumes/create", {"configuration": conf}
    # Unknown types go to the run planner, which must reject them.
    return f"{base}/runs/get_plan", {"run_spec": {"configuration": conf}}


def post(url: str, token: str, path: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int, str]:
    request = urllib.request.Request(
        url.rstrip("/") + path,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def check_http(conf: dict[str, Any], expect_ok: bool, url: str, token: str, project: str) -> str | None:
    """None if the server answers as dstack would, else why not."""
    path, body = plan_request(conf, project)
    try:
        status, text = post(url, token, path, body)
    except (urllib.error.URLError, OSError) as e:
        return f"POST {path}: {e}"
    if expect_ok and (status == 422 or status >= 500):
        return f"POST {path} -> {status}: {text[:300]}"
    if not expect_ok and status != 422:
        return f"POST {path} -> {status}, expected 422: {text[:300]}"
    return None


def run(args: argparse.Namespace) -> int:
    accepted, rejected = load_corpus(Path(args.reference_dir))
    failures: list[str] = []
    counts = {"accepted_ok": 0, "accepted_failed": 0, "rejected_ok": 0, "rejected_passed": 0}
    for expect_ok, entries in ((True, accepted), (False, rejected)):
        for entry in entries:
            conf = entry["config"]
            where = f"{entry['source']} (type={conf.get('type')}, name={conf.get('name')})"
            if args.url:
                problem = check_http(conf, expect_ok, args.url, args.token, args.project)
            else:
                error = check_local(json.loads(json.dumps(conf)))
                problem = error if expect_ok else (None if error else "accepted, but dstack rejects it")
            key = ("accepted_" if expect_ok else "rejected_") + (
                "ok" if problem is None else ("failed" if expect_ok else "passed")
            )
            counts[key] += 1
            if problem is not None:
                failures.append(f"{'ACCEPTED' if expect_ok else 'REJECTED'} {where}: {problem}")
    for line in failures:
        print(line)
    print(
        f"accepted: {counts['accepted_ok']}/{len(accepted)} pass; "
        f"rejected: {counts['rejected_ok']}/{len(rejected)} rejected"
    )
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--reference-dir", default=str(DEFAULT_REFERENCE_DIR))
    parser.add_argument("--url", help="server URL; omit to check the parser locally")
    parser.add_argument("--token", help="bearer token (HTTP mode)")
    parser.add_argument("--project", default="main")
    args = parser.parse_args(argv)
    if args.url and not args.token:
        parser.error("--token is required with --url")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
