"""The per-job limit on stored output: a job printing past it keeps its newest output, its oldest is dropped,
and a line in its diagnostics says how much."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx

from server_harness import finished_run, fleet_body, make_settings, running_server, task_body

MiB = 2**20
#: This test's limit (the default is far larger than what it prints).
LIMIT = 1 * MiB
#: 40000 numbered lines of 100 bytes: 4 MB, four times the limit.
PRINT = "python3 -c \"import sys\nfor i in range(40000): sys.stdout.write('%099d\\n' % i)\""


async def _poll(c: httpx.AsyncClient, run: dict[str, Any], **more: Any) -> list[bytes]:
    sub = run["jobs"][0]["job_submissions"][-1]["id"]
    got: list[bytes] = []
    token = None
    while True:
        body = {"run_name": run["run_spec"]["run_name"], "job_submission_id": sub, "limit": 1000, **more}
        if token:
            body["next_token"] = token
        r = await c.post("/api/project/main/logs/poll", json=body)
        assert r.status_code == 200, r.text
        page = r.json()
        got += [base64.b64decode(x["message"]) for x in page["logs"]]
        token = page.get("next_token")
        if not token or not page["logs"]:
            return got


async def test_a_job_printing_past_its_limit_keeps_its_newest_output_and_says_what_was_dropped(
    tmp_path: Path,
) -> None:
    async with running_server(make_settings(tmp_path, job_log_limit=LIMIT)) as s, s.client() as c:
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body())).status_code == 200
        assert (await c.post("/api/project/main/runs/apply", json=task_body([PRINT], name="loud"))).status_code == 200
        run = await finished_run(c, "loud")
        assert run["status"] == "done"
        lines = await _poll(c, run)
        stored = sum(len(m) for m in lines)
        assert stored <= LIMIT + 2000 * 100, stored  # past the limit by at most the last reply's entries
        numbers = [int(m) for m in lines]
        assert numbers[-1] == 39999 and numbers == list(range(numbers[0], 40000))  # the newest, none missing
        assert numbers[0] > 0
        said = [m.decode() for m in await _poll(c, run, diagnose=True) if b"oldest output were dropped" in m]
        assert said and all("CORRAL_JOB_LOG_LIMIT_MB" in m for m in said), said
        dropped = sum(int(m.split(" entries")[0]) for m in said)
        assert dropped == numbers[0]  # every dropped entry counted
