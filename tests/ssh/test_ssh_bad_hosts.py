"""Bad input for an SSH fleet, through the CLI as a user runs it: each bad host ends with its own clear
error in the fleet's status and in ``corral fleet`` -- never a host stuck in provisioning -- while the
good host of the same fleet works. Applying again retries the failed hosts."""

from __future__ import annotations

import time
from pathlib import Path

from ssh_harness import by_host, corral_cli, fleet_settled

from fakehosts import FakeHosts
from server_harness import RunningServer, wait_for


async def test_each_bad_host_gets_its_own_error(server: RunningServer, hosts: FakeHosts, tmp_path: Path) -> None:
    unreachable = hosts.unused_ip()
    config = tmp_path / "broken.dstack.yml"
    config.write_text(
        f"""type: fleet
name: broken
ssh_config:
  user: root
  identity_file: {hosts.key}
  hosts:
    - {hosts.ip("gpu")}
    - {unreachable}
    - hostname: {hosts.ip("gpu")}
      port: 2222
    - hostname: {hosts.ip("cpu1")}
      identity_file: {hosts.wrong_key}
    - {hosts.ip("bare")}
    - hostname: {hosts.ip("cpu2")}
      user: nologin
"""
    )
    started = time.monotonic()
    code, out = await corral_cli(server, tmp_path, "apply", "-f", str(config), "-y")
    elapsed = time.monotonic() - started
    assert code == 1 and "Some instances failed" in out, out
    # Transient failures are retried for the provisioning timeout, then reported: nothing stays pending.
    assert elapsed < server.settings.provisioning_timeout + 20, elapsed
    async with server.client() as c:
        fleet = await wait_for(lambda: fleet_settled(c, "broken", 6), timeout=5)
        insts = by_host(fleet)
        good = [i for i in fleet["instances"] if i["status"] == "idle"]
        assert [i["hostname"] for i in good] == [hosts.ip("gpu")]
        failed = {i["hostname"]: i for i in fleet["instances"] if i["status"] == "terminated"}
        assert len(failed) == 5, fleet
        expect = {
            unreachable: ["root@" + unreachable + ":22", "gave up after"],
            hosts.ip("cpu1"): ["the login was refused", "did not accept the key for user 'root'"],
            hosts.ip("bare"): ["python3 is not installed"],
            hosts.ip("cpu2"): ["nologin@", "cannot run commands", "This account is currently not available"],
        }
        for host, parts in expect.items():
            message = insts[host]["termination_reason_message"]
            assert insts[host]["termination_reason"] == "error"
            for part in parts:
                assert part in message, (host, message)
        refused = next(i for i in failed.values() if ":2222" in i["termination_reason_message"])
        assert "connection was refused" in refused["termination_reason_message"]
        assert "gave up after" in refused["termination_reason_message"]
        assert fleet["status"] == "active"
        assert fleet["status_message"].startswith("5 of 6 hosts failed: ")
        for i in failed.values():
            assert i["termination_reason_message"] in fleet["status_message"]

        code, table = await corral_cli(server, tmp_path, "fleet")
        assert code == 0
        for needle in ("python3 is not installed", "did not accept the key", "refused", "cannot run commands"):
            assert needle in table, table

        # Fix the key, drop the hosts that do not answer, apply again (a changed host re-creates the fleet,
        # as in dstack): the fixed host works now.
        text = config.read_text().replace(str(hosts.wrong_key), str(hosts.key))
        text = text.replace(f"    - {unreachable}\n", "").replace(
            f"    - hostname: {hosts.ip('gpu')}\n      port: 2222\n", ""
        )
        config.write_text(text)
        code, out = await corral_cli(server, tmp_path, "apply", "-f", str(config), "-y")
        assert "Cannot update the fleet in-place" in out, out
        insts = by_host(await wait_for(lambda: fleet_settled(c, "broken", 4), timeout=30))
        assert insts[hosts.ip("cpu1")]["status"] == "idle", insts[hosts.ip("cpu1")]
        assert insts[hosts.ip("bare")]["status"] == "terminated"
    print(f"bad hosts reported after {elapsed:.1f}s")
