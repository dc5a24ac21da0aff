"""EBS volumes on EC2 (moto), end to end: ``volumes/create`` makes a gp3 volume in its zone (and
registers an existing one by ``volume_id``), a run with ``volumes: [name:/path]`` is placed in the
volume's zone, the volume is attached to its instance, mounted in the job (formatted when new), detached
when the job ends and attached again to the next job, which reads what the first wrote; a volume in use
cannot be deleted; a deleted volume is gone from EC2; bad configurations get dstack's errors; a mount point
with alternatives (``name: [a, b]``, applied by the official client) mounts the one its instance's zone has.

The test's watcher plays EBS: when moto records an attachment, the volume's file (one per volume id,
made on first use) is set up as a loop device and linked, in the instance's fake host only, at the
udev path a Nitro instance has (``/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol...``); the loop
device goes when moto records the detachment. Files and loop devices are removed afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aws_server import fleet_server
from dstack_client_env import CorralServer, DstackCli, client_venv, short_home
from moto_harness import REGION, VPC_NAME, Hypervisor, MotoEC2

from server_harness import RunningServer, finished_run, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")

ZONE = f"{REGION}b"  # the fake hosts' subnet
CONFIG = f"""
projects:
  - name: main
    backends:
      - type: aws
        creds: {{type: access_key, access_key: AKIAVOLS, secret_key: vols-secret-value}}
        regions: [{REGION}]
        vpc_name: {VPC_NAME}
        public_ips: false
"""
FLEET = {"type": "fleet", "name": "volfl", "nodes": "0..1", "backends": ["aws"], "resources": {"cpu": "2.."}}
BY_ID = "/dev/disk/by-id"


class EBS:
    """The watcher (see the module's docstring)."""

    def __init__(self, moto: MotoEC2, hv: Hypervisor, base: Path) -> None:
        self.moto, self.hv, self.base = moto, hv, base
        self.loops: dict[tuple[str, str], str] = {}  # (volume id, instance id) -> loop device
        self.errors: list[str] = []
        self.made_dev_disk = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ebs", daemon=True)

    def start(self) -> EBS:
        self.made_dev_disk = not os.path.isdir("/dev/disk")  # the mount point of each host's own /dev/disk
        os.makedirs("/dev/disk", exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for key in list(self.loops):
            self._release(key)
        for f in self.base.glob("vol-*.img"):  # by prefix
            f.unlink()
        if self.made_dev_disk:
            with contextlib.suppress(OSError):  # left while a host still mounts its own over it
                os.rmdir("/dev/disk")

    def _loop(self) -> None:
        ec2 = self.moto.client()
        while not self._stop.is_set():
            try:
                self._tick(ec2)
            except Exception as e:
                self.errors.append(repr(e))
            self._stop.wait(0.1)

    def _tick(self, ec2: Any) -> None:
        now = set()
        for v in ec2.describe_volumes()["Volumes"]:
            for a in v.get("Attachments") or []:
                if a.get("State") in ("attaching", "attached"):
                    now.add((v["VolumeId"], a["InstanceId"]))
        for key in list(self.loops):
            if key not in now:
                self._release(key)
        for key in now - set(self.loops):
            host = self.hv.by_instance.get(key[1])
            if host is None:
                continue
            img = self.base / f"{key[0]}.img"
            if not img.exists():
                with open(img, "wb") as f:
                    f.truncate(64 << 20)
            loop = subprocess.run(["losetup", "-f", "--show", str(img)], check=True, capture_output=True, text=True)
            dev = loop.stdout.strip()
            self.loops[key] = dev
            link = f"{BY_ID}/nvme-Amazon_Elastic_Block_Store_{key[0].replace('-', '')}"
            script = f"mountpoint -q /dev/disk || mount -t tmpfs tmpfs /dev/disk; mkdir -p {BY_ID}; ln -sf {dev} {link}"
            try:
                done = self.hv.hosts.exec(host, script, timeout=30)
            except (AssertionError, IndexError):  # the host is not up yet (or going): the next tick tries again
                subprocess.run(["losetup", "-d", self.loops.pop(key)], capture_output=True)
                continue
            if done.returncode != 0:
                self.errors.append(f"link in {host}: {done.stderr.decode(errors='replace')}")

    def _release(self, key: tuple[str, str]) -> None:
        dev = self.loops.pop(key)
        host = self.hv.by_instance.get(key[1])
        if host is not None and key[1] in self.hv.by_instance:  # a terminated instance's host is gone
            link = f"{BY_ID}/nvme-Amazon_Elastic_Block_Store_{key[0].replace('-', '')}"
            with contextlib.suppress(AssertionError, IndexError, OSError):  # terminated meanwhile
                self.hv.hosts.exec(host, f"rm -f {link}", timeout=30)
        subprocess.run(["losetup", "-d", dev], capture_output=True)


@pytest.fixture(scope="module")
def ebs(moto: MotoEC2, hypervisor: Hypervisor, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EBS]:
    e = EBS(moto, hypervisor, tmp_path_factory.mktemp("ebs")).start()
    try:
        yield e
    finally:
        e.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory, hypervisor: Hypervisor, ebs: EBS
) -> AsyncIterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("volserver")
    async with fleet_server(tmp, CONFIG, FLEET, safety_net_interval=1.0, instance_check_interval=1.0) as s:
        yield s


async def _volume(c: Any, name: str, status: str = "active") -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        r = await c.post("/api/project/main/volumes/get", json={"name": name})
        assert r.status_code == 200, r.text
        got = dict(r.json())
        assert got["status"] != "failed" or status == "failed", got
        return got if got["status"] == status else None

    return dict(await wait_for(check, timeout=30))


def _task(name: str, commands: list[str], volumes: list[Any]) -> dict[str, Any]:
    conf = {"type": "task", "name": name, "commands": commands, "fleets": ["volfl"], "resources": {"cpu": "2.."},
            "volumes": volumes}  # fmt: skip
    return {"force": True, "plan": {"run_spec": {"configuration": conf}}}


async def test_bad_volume_configurations_are_refused(server: RunningServer) -> None:
    base = {"type": "volume", "backend": "aws", "region": REGION}
    async with server.client() as c:
        for conf, status, words in (
            ({**base, "name": "nosize"}, 400, "either existing identifier or size"),
            ({**base, "backend": "gcp", "size": 10}, 400, "not supported for gcp"),
            ({**base, "name": "Bad_Name!", "size": 10}, 400, "Resource name should match"),
            ({"type": "volume", "backend": "aws", "size": 10}, 422, "region"),
            ({**base, "size": "lots"}, 422, "size"),
        ):
            r = await c.post("/api/project/main/volumes/create", json={"configuration": conf})
            assert r.status_code == status and words in r.text, (conf, r.text)
        r = await c.post("/api/project/main/runs/apply", json=_task("novol", ["true"], ["missing:/data"]))
        assert r.status_code == 400 and "Volume missing not found" in r.text, r.text


async def test_register_an_existing_volume_by_id(server: RunningServer, moto: MotoEC2) -> None:
    made = moto.client().create_volume(Size=2, AvailabilityZone=ZONE, VolumeType="gp3")["VolumeId"]
    conf = {"type": "volume", "backend": "aws", "region": REGION, "name": "ext", "volume_id": made}
    async with server.client() as c:
        r = await c.post("/api/project/main/volumes/create", json={"configuration": conf})
        assert r.status_code == 200, r.text
        got = await _volume(c, "ext")
        assert got["external"] is True and got["volume_id"] == made
        assert got["provisioning_data"]["availability_zone"] == ZONE and got["provisioning_data"]["size_gb"] == 2
        r = await c.post("/api/project/main/volumes/delete", json={"names": ["ext"]})
        assert r.status_code == 200, r.text

        async def gone() -> bool:
            listed = (await c.post("/api/project/main/volumes/list", json={})).json()
            return "ext" not in {v["name"] for v in listed}

        await wait_for(gone, timeout=20)
    assert moto.client().describe_volumes(VolumeIds=[made])["Volumes"]  # registered: never deleted in EC2


async def test_a_volume_follows_jobs_and_keeps_their_data(server: RunningServer, moto: MotoEC2, ebs: EBS) -> None:
    conf = {"type": "volume", "backend": "aws", "region": REGION, "availability_zone": ZONE, "name": "data",
            "size": 1, "tags": {"team": "ml"}}  # fmt: skip
    async with server.client() as c:
        r = await c.post("/api/project/main/volumes/create", json={"configuration": conf})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "submitted"
        vol = await _volume(c, "data")
        vid = vol["volume_id"]
        (described,) = moto.client().describe_volumes(VolumeIds=[vid])["Volumes"]
        tags = {t["Key"]: t["Value"] for t in described.get("Tags") or []}
        assert described["VolumeType"] == "gp3" and described["AvailabilityZone"] == ZONE
        assert tags["corral_project"] == "main" and tags["Name"] == "data" and tags["team"] == "ml"

        write = ['test -z "$(ls -A /data | grep -v lost+found)"', "echo kept > /data/f.txt", "sleep 4"]
        r = await c.post("/api/project/main/runs/apply", json=_task("writer", write, ["data:/data"]))
        assert r.status_code == 200, r.text

        async def attached() -> dict[str, Any] | None:
            got = (await c.post("/api/project/main/volumes/get", json={"name": "data"})).json()
            return got if got["attachments"] else None

        used = await wait_for(attached, timeout=120)
        assert used["attachments"][0]["attachment_data"]["device_name"] == "/dev/sdf"
        r = await c.post("/api/project/main/volumes/delete", json={"names": ["data"]})
        assert r.status_code == 400 and "Failed to delete volume data. Volume is in use." in r.text, r.text
        run = await finished_run(c, "writer", timeout=120)
        assert run["status"] == "done", run["jobs"][0]["job_submissions"][-1]

        async def detached() -> bool:
            got = (await c.post("/api/project/main/volumes/get", json={"name": "data"})).json()
            return not got["attachments"]

        await wait_for(detached, timeout=60)
        assert not moto.client().describe_volumes(VolumeIds=[vid])["Volumes"][0]["Attachments"]

        read = ["mountpoint -q /data", "grep -qx kept /data/f.txt"]
        r = await c.post(
            "/api/project/main/runs/apply", json=_task("reader", read, [{"name": "data", "path": "/data"}])
        )
        assert r.status_code == 200, r.text
        run = await finished_run(c, "reader", timeout=120)
        assert run["status"] == "done", run["jobs"][0]["job_submissions"][-1]
        await wait_for(detached, timeout=60)
        r = await c.post("/api/project/main/volumes/delete", json={"names": ["data"]})
        assert r.status_code == 200, r.text

        def deleted() -> bool:
            return vid not in {v["VolumeId"] for v in moto.client().describe_volumes()["Volumes"]}

        async def gone() -> bool:
            return deleted()

        await wait_for(gone, timeout=30)
    assert not ebs.errors, ebs.errors


async def test_corral_and_dstack_clis_list_and_delete_volumes(
    server: RunningServer, moto: MotoEC2, tmp_path: Path
) -> None:
    base = {"type": "volume", "backend": "aws", "region": REGION, "availability_zone": ZONE, "size": 1}
    async with server.client() as c:  # clia through the API, clib with `dstack apply` below
        r = await c.post("/api/project/main/volumes/create", json={"configuration": {**base, "name": "clia"}})
        assert r.status_code == 200, r.text
        made = {"clia": (await _volume(c, "clia"))["volume_id"]}
    (tmp_path / "corral").mkdir()
    (tmp_path / "corral" / "config.yml").write_text(
        f"projects:\n- {{name: main, url: '{server.url}', token: {server.token}, default: true}}\n"
    )
    env = {**os.environ, "CORRAL_CONFIG_DIR": str(tmp_path / "corral"), "COLUMNS": "200"}

    async def corral(*args: str) -> str:  # in a thread: the server answers on this event loop
        argv = [sys.executable, "-m", "corral.cli.main", *args]
        out = await asyncio.to_thread(subprocess.run, argv, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "Traceback" not in out.stderr, f"corral {args}: {out.stdout}\n{out.stderr}"
        return out.stdout

    (tmp_path / "work").mkdir()
    with short_home() as home:
        stand_in = CorralServer(server.url, server.token, tmp_path, tmp_path / "no.log", None)  # type: ignore[arg-type]
        cli = DstackCli(client_venv(), home, tmp_path / "work", stand_in)
        (home / ".dstack").mkdir()
        (home / ".dstack" / "config.yml").write_text(
            f"projects:\n- name: main\n  url: {server.url}\n  token: {server.token}\n  default: true\n"
        )
        yml = "".join(f"{k}: {v}\n" for k, v in {**base, "name": "clib", "size": "1GB"}.items())
        cli.write("vol.dstack.yml", yml)
        await asyncio.to_thread(cli.ok, "apply", "-f", "vol.dstack.yml", "-y", "-d")
        async with server.client() as c:
            made["clib"] = (await _volume(c, "clib"))["volume_id"]
        listed = await corral("volume", "list")
        for name, vid in made.items():
            assert name in listed and vid in listed and ZONE in listed, listed
        shown = (await asyncio.to_thread(cli.ok, "volume", "list")).stdout
        assert "clia" in shown and "clib" in shown and "active" in shown, shown
        await asyncio.to_thread(cli.ok, "volume", "delete", "clib", "-y")
    assert "marked for deletion" in await corral("volume", "delete", "clia", "-y")

    def gone() -> bool:
        left = {v["VolumeId"] for v in moto.client().describe_volumes()["Volumes"]}
        return not (set(made.values()) & left)

    async def deleted() -> bool:
        return gone()

    await wait_for(deleted, timeout=30)
    async with server.client() as c:
        listed_now = (await c.post("/api/project/main/volumes/list", json={})).json()
    assert not {"clia", "clib"} & {v["name"] for v in listed_now}


async def test_a_mount_point_with_alternatives_mounts_the_one_its_instance_can(
    server: RunningServer, moto: MotoEC2, ebs: EBS, tmp_path: Path
) -> None:
    """dstack's ``name: [a, b]``: the job runs where one alternative of each mount point is and mounts that
    one (``job_runtime_data.volume_names`` says which); a run whose mount points share no zone is refused,
    naming the volumes and where they are."""
    made = (("altfar", "eu-west-1", "eu-west-1a"), ("altnear", REGION, ZONE))
    async with server.client() as c:
        for name, region, zone in made:
            conf = {"type": "volume", "backend": "aws", "region": region, "availability_zone": zone, "name": name,
                    "size": 1}  # fmt: skip
            r = await c.post("/api/project/main/volumes/create", json={"configuration": conf})
            assert r.status_code == 200, r.text
        for name, _region, _zone in made:
            await _volume(c, name)

        apart = _task("altapart", ["true"], [{"name": ["altfar"], "path": "/a"}, {"name": "altnear", "path": "/b"}])
        for path in ("runs/get_plan", "runs/apply"):
            r = await c.post(f"/api/project/main/{path}", json=apart if path == "runs/apply" else apart["plan"])
            assert r.status_code == 400, r.text
            for words in ("altfar (eu-west-1 eu-west-1a)", f"altnear ({REGION} {ZONE})", "volumes"):
                assert words in r.text, r.text

        only_far = _task("altonly", ["true"], [{"name": ["altfar"], "path": "/d"}])["plan"]
        r = await c.post("/api/project/main/runs/get_plan", json=only_far)
        assert r.status_code == 200 and not r.json()["job_plans"][0]["offers"], r.text
        assert "the volumes: altfar (eu-west-1 eu-west-1a)" in r.json()["corral_plan_error"], r.json()
        either = [{"name": ["altfar", "altnear"], "path": "/data"}]
        r = await c.post("/api/project/main/runs/get_plan", json=_task("altplan", ["true"], either)["plan"])
        assert r.status_code == 200, r.text
        offers = r.json()["job_plans"][0]["offers"]
        assert offers and {o["region"] for o in offers} == {REGION}, offers  # the backend has no eu-west-1

        # applied by the official client, as dstack's docs write it
        yml = (
            "type: task\nname: altrun\nfleets: [volfl]\nresources:\n  cpu: 2..\ncommands:\n  - mountpoint -q /data\n"
            "volumes:\n  - name: [altfar, altnear]\n    path: /data\n"
        )
        (tmp_path / "work").mkdir()
        with short_home() as home:
            stand_in = CorralServer(server.url, server.token, tmp_path, tmp_path / "no.log", None)  # type: ignore[arg-type]
            cli = DstackCli(client_venv(), home, tmp_path / "work", stand_in)
            (home / ".dstack").mkdir()
            (home / ".dstack" / "config.yml").write_text(
                f"projects:\n- name: main\n  url: {server.url}\n  token: {server.token}\n  default: true\n"
            )
            cli.write("alt.dstack.yml", yml)
            await asyncio.to_thread(cli.ok, "apply", "-f", "alt.dstack.yml", "-y", "-d")
        run = await finished_run(c, "altrun", timeout=120)
        sub = run["jobs"][0]["job_submissions"][-1]
        assert run["status"] == "done", sub
        assert sub["job_runtime_data"]["volume_names"] == ["altnear"], sub["job_runtime_data"]
        far = (await _volume(c, "altfar"))["volume_id"]
        assert not moto.client("eu-west-1").describe_volumes(VolumeIds=[far])["Volumes"][0]["Attachments"]
        for name, _region, _zone in made:

            async def detached(name: str = name) -> bool:
                got = (await c.post("/api/project/main/volumes/get", json={"name": name})).json()
                return not got["attachments"]

            await wait_for(detached, timeout=60)
        r = await c.post("/api/project/main/volumes/delete", json={"names": [n for n, _r, _z in made]})
        assert r.status_code == 200, r.text
    assert not ebs.errors, ebs.errors
