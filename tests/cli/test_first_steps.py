"""What a newcomer sees first: the no-fleet and no-offer messages say what to do here (not a link
elsewhere); ``ps -v`` and ``fleet`` fit the terminal (or a pipe's 80 columns) without cutting text; every
command that prints a table also prints JSON."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_fakes import JPD, FakeClient, Result, make_run, submission
from rich.console import Console
from test_commands import FLEET, FLEET_YML, TASK_YML, run_plan

from corral.cli import render
from corral.sdk import config_file

CLI = Callable[..., Result]
FLEET_HINT = "corral apply -f examples/fleet.dstack.yml"
LONG_ERROR = "No matching fleet found: no fleet of this project can run this job (there is none, or none fits)"


def test_apply_with_no_fleet_says_to_apply_one_first(fake: FakeClient, cli: CLI) -> None:
    Path(".dstack.yml").write_text(TASK_YML)
    fake.run_plan = run_plan()
    result = cli("apply", "-y", "-d")
    text = " ".join(result.out.split())
    assert "The project has no fleets" in text and f"Apply a fleet first, e.g. {FLEET_HINT}" in text
    assert "dstack.ai" not in result.out


def test_no_offers_says_where_to_look(fake: FakeClient, cli: CLI) -> None:
    Path(".dstack.yml").write_text(TASK_YML)
    fake.run_plan = run_plan()
    fake.fleets = [FLEET]  # a fleet exists, but offers nothing for this run
    result = cli("apply", "-y", "-d")
    text = " ".join(result.out.split())
    assert "No matching instance offers available" in text
    assert "corral fleet -v" in text and "corral offer" in text and FLEET_HINT in text
    assert "dstack.ai" not in result.out
    offer = " ".join(cli("offer").out.split())
    assert "corral offer" in offer and "dstack.ai" not in offer


def test_a_fleet_without_offers_says_what_to_do(fake: FakeClient, cli: CLI) -> None:
    Path(".dstack.yml").write_text(FLEET_YML)
    fake.fleet_plan = {"spec": FLEET["spec"], "offers": [], "action": "create", "current_resource": None}
    result = cli("apply", "-y")
    text = " ".join(result.out.split())
    assert "no backend of this project can create an instance with these resources" in text
    assert "corral offer" in text and "dstack.ai" not in result.out


def test_the_scheduler_no_fleet_message_keeps_dstack_prefix_and_says_what_to_do() -> None:
    from corral.scheduler.schedule import NO_FLEETS_MESSAGE

    # dstack's clients show "no fleets" for a job whose message starts so
    assert NO_FLEETS_MESSAGE.startswith("No matching fleet found")
    assert FLEET_HINT in NO_FLEETS_MESSAGE and "dstack.ai" not in NO_FLEETS_MESSAGE


def _runs() -> list[dict[str, object]]:
    return [
        make_run("train-a-rather-long-run-name", "running", submission("running", job_provisioning_data=JPD)),
        make_run(
            "old",
            "failed",
            submission(
                "failed",
                termination_reason="failed_to_start_due_to_no_capacity",
                termination_reason_message=LONG_ERROR,
            ),
            status_message="failed",
            error=LONG_ERROR,
        ),
    ]


def _render(table: object, width: int) -> list[str]:
    console = Console(width=width, force_terminal=False, color_system=None)
    with console.capture() as capture:
        console.print(table)
    return capture.get().splitlines()


@pytest.mark.parametrize("width", [60, 80, 100, 120, 160])
def test_ps_verbose_fits_the_width_and_cuts_nothing(width: int) -> None:
    lines = _render(render.runs_table(_runs(), verbose=True, width=width), width)
    assert all(len(line.rstrip()) <= width for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    assert "…" not in text
    assert "train-a-rather-long-run-name" in text and "running" in text and "no fleets" in text
    # the error is all there, wrapped at spaces, never cut inside a word
    assert " ".join(text.split()).count("there is none, or none fits)") == 1
    words = {w for line in lines for w in line.split()}
    assert {"project", "matching", "fleet"} <= words
    header = lines[0].split()
    assert header[0] == "NAME" and "STATUS" in header and "ERROR" in header
    if width >= 160:
        assert "INSTANCE" in header and "RESOURCES" in header and "BACKEND" in header


def test_ps_verbose_drops_the_least_useful_columns_first() -> None:
    wide = _render(render.runs_table(_runs(), verbose=True, width=200), 200)[0].split()
    narrow = _render(render.runs_table(_runs(), verbose=True, width=100), 100)[0].split()
    assert "TYPE" in wide and "PRICE" in wide
    assert "TYPE" not in narrow and "PRICE" not in narrow and "RESOURCES" in narrow


def test_ps_verbose_in_a_pipe_fits_80_columns(fake: FakeClient, cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS")  # captured output is not a terminal: Rich lays out for 80 columns
    fake.run_list = _runs()
    result = cli("ps", "-v")
    assert result.code == 0, result.err
    assert all(len(line.rstrip()) <= 80 for line in result.out.splitlines()), result.out
    assert "there is none, or none fits)" in " ".join(result.out.split()) and "…" not in result.out
    assert not re.search(r"\x1b\[", result.out)  # no colour codes in a pipe


def test_fleet_table_fits_too() -> None:
    fleet = json.loads(json.dumps(FLEET))
    fleet["status_message"] = LONG_ERROR
    lines = _render(render.fleets_table([fleet], "main", verbose=True, width=80), 80)
    assert all(len(line.rstrip()) <= 80 for line in lines)
    start = lines[0].index("ERROR")
    assert " ".join(" ".join(line[start:] for line in lines[1:]).split()) == LONG_ERROR


def test_json_wherever_a_table_is_printed(fake: FakeClient, cli: CLI) -> None:
    fake.fleets = [FLEET]
    for argv in (["fleet", "--json"], ["fleet", "list", "--json"]):
        result = cli(*argv)
        assert result.code == 0, result.err
        assert json.loads(result.out) == {"project": "main", "fleets": [FLEET]}
    assert cli("fleet", "--json", "--watch").code == 1
    fake.run_list = _runs()
    names = [r["run_spec"]["run_name"] for r in json.loads(cli("ps", "--json").out)["runs"]]
    assert names == ["train-a-rather-long-run-name", "old"]
    fake.run_plan = run_plan()
    assert json.loads(cli("offer", "--json").out)["offers"] == []
    config_file.add_project("dev", "http://127.0.0.1:3001", "secret-token", default=False)
    result = cli("project", "list", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out) == {
        "projects": [
            {"name": "main", "url": "http://127.0.0.1:3000", "default": True},
            {"name": "dev", "url": "http://127.0.0.1:3001", "default": False},
        ]
    }
    assert "secret-token" not in result.out and "tok" not in result.out


#: What a job on a host without iptables reports as its status (the agent's sandbox probe, as the server relays it).
NO_SANDBOX = "Runs without a sandbox: missing on this host: iptables or nft (install iproute2 and iptables)"


def _column(lines: list[str], header: str) -> str:
    """The words of one column, read top to bottom (up to the next header, or the line's end)."""
    heads = lines[0].split()
    start = lines[0].index(header)
    following = heads.index(header) + 1
    end = lines[0].index(heads[following], start) if following < len(heads) else None
    return " ".join(" ".join(line[start:end] for line in lines[1:]).split())


@pytest.mark.parametrize("verbose", [False, True])
@pytest.mark.parametrize("width", [80, 120])
def test_a_long_status_wraps_and_the_fix_stays_readable(width: int, verbose: bool) -> None:
    sub = submission("running", job_provisioning_data=JPD, status_message=NO_SANDBOX)
    runs = [make_run("no-sandbox", "running", sub)]
    lines = _render(render.runs_table(runs, verbose=verbose, width=width), width)
    assert all(len(line.rstrip()) <= width for line in lines), "\n".join(lines)
    assert "…" not in "\n".join(lines)
    assert _column(lines, "STATUS") == NO_SANDBOX, "\n".join(lines)
