"""Dev environments through the API: dstack's job commands and ``app_specs`` in the plan, and bad input
refused (422) naming the field, as dstack refuses it."""

from __future__ import annotations

from typing import Any

from server_harness import RunningServer

P = "/api/project/main"
RESOURCES = {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."}


def _dev(**fields: Any) -> dict[str, Any]:
    return {"run_spec": {"run_name": "dev1", "configuration": {"type": "dev-environment", "resources": RESOURCES,
                                                                **fields}}}  # fmt: skip


async def test_the_plan_carries_dstacks_commands_and_the_ports_to_forward(server: RunningServer) -> None:
    async with server.client() as c:
        r = await c.post(f"{P}/runs/get_plan", json=_dev(ide="vscode", init=["echo hi"], ports=["8888", "*:9000"]))
    assert r.status_code == 200, r.text
    spec = r.json()["job_plans"][0]["job_spec"]
    commands = spec["commands"]
    assert commands[commands.index("echo hi") + 1 :] == [
        "echo 'To open in VS Code, use link below:'",
        "echo",
        'echo "  vscode://vscode-remote/ssh-remote+dev1$DSTACK_WORKING_DIR"',
        "echo",
        "echo 'To connect via SSH, use: `ssh dev1`'",
        "echo",
        "echo -n 'To exit, press Ctrl+C.'",
        "tail -f /dev/null",
    ]
    assert not any("vscode-server" in c for c in commands), "no `version`: nothing is downloaded"
    assert [(a["port"], a["map_to_port"], a["app_name"]) for a in spec["app_specs"]] == [
        (8888, 8888, "app_0"),
        (9000, None, "app_1"),
    ]


async def test_version_downloads_from_the_configured_base(server: RunningServer) -> None:
    async with server.client() as c:
        r = await c.post(f"{P}/runs/get_plan", json=_dev(ide="vscode", version="0123abcd"))
    joined = "\n".join(r.json()["job_plans"][0]["job_spec"]["commands"])
    assert "https://update.code.visualstudio.com/commit:0123abcd/server-linux-$arch/stable" in joined
    assert "server download failed" in joined and "CORRAL_IDE_DOWNLOAD_URL" in joined


async def test_bad_input_is_422_naming_the_field(server: RunningServer) -> None:
    cases = [
        (_dev(version="0123abcd"), "`version` requires `ide` to be set"),
        (_dev(ide="emacs"), "ide"),
        (_dev(inactivity_duration="soon"), "inactivity_duration"),
        (_dev(ide="windsurf", version="1.2"), "Invalid Windsurf version format"),
    ]
    async with server.client() as c:
        for body, words in cases:
            r = await c.post(f"{P}/runs/apply", json={"plan": body, "force": False})
            assert r.status_code == 422, (body, r.text)
            assert words in r.text, (body, r.text)
        listed = (await c.post(f"{P}/runs/list", json={})).json()
    assert not [run for run in listed if run["run_spec"]["run_name"] == "dev1"], "nothing was written"
