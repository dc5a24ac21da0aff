"""``startup_order`` of a multi-node task (local backend, real server and agents), as dstack 0.22.5 runs it:
``master-first`` starts the worker once the master runs, ``workers-first`` the master once the workers run."""

from __future__ import annotations

from pathlib import Path

import pytest

from server_harness import finished_run, fleet_body, make_settings, running_server, task_body


@pytest.mark.parametrize(("order", "first", "second"), [("master-first", 0, 1), ("workers-first", 1, 0)])
async def test_one_node_starts_once_the_other_runs(tmp_path: Path, order: str, first: int, second: int) -> None:
    # each node notes when it started; the one that goes first stays up a while, the other checks it was there
    script = (
        f'date +%s%N > {tmp_path}/start-$DSTACK_NODE_RANK; '
        f'if [ "$DSTACK_NODE_RANK" = {first} ]; then sleep 3; '
        f"else test -f {tmp_path}/start-{first} || {{ echo started before node {first}; exit 7; }}; fi"
    )  # fmt: skip
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2", placement="cluster"))
        body = task_body([script], name="pair", nodes=2, startup_order=order)
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 200, r.text
        run = await finished_run(c, "pair")
        assert (run["status"], run["termination_reason"]) == ("done", "all_jobs_done"), run
        started = {n: int((tmp_path / f"start-{n}").read_text()) for n in (0, 1)}
        assert started[first] < started[second], started
