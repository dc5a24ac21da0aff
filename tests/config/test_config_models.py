"""Expected values for dstack's grammar and normalisation, independent of the dstack oracle:
shorthands, defaults, normalised JSON, error paths, profiles and file loading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from corral.config import (
    AWSVolumeConfiguration,
    ConfigError,
    DevEnvironmentConfiguration,
    EntityReference,
    EnvSentinel,
    FleetConfiguration,
    GatewayConfiguration,
    InstanceSelector,
    Profile,
    ProfileParams,
    ResourcesSpec,
    RetrySpec,
    ServiceConfiguration,
    TaskConfiguration,
    effective_profile,
    load_configuration_file,
    parse_configuration,
    parse_fleet_configuration,
    parse_gateway_configuration,
    parse_profile,
    parse_run_configuration,
    parse_volume_configuration,
)
from corral.domain.resources import GpuSpec, Range, Requirements

TASK: dict[str, Any] = {"type": "task", "commands": ["python train.py"]}


def task(**fields: Any) -> TaskConfiguration:
    conf = parse_run_configuration({**TASK, **fields})
    assert isinstance(conf, TaskConfiguration)
    return conf


def error_locs(data: dict[str, Any]) -> list[tuple[int | str, ...]]:
    with pytest.raises(ValidationError) as info:
        parse_configuration(data)
    return [tuple(e["loc"]) for e in info.value.errors()]


def test_default_resources_are_dstacks_normalised_json() -> None:
    assert task().model_dump(mode="json")["resources"] == {
        "cpu": {"arch": None, "count": {"min": 2, "max": None}},
        "memory": {"min": 8.0, "max": None},
        "shm_size": None,
        "gpu": {
            "vendor": None,
            "name": None,
            "count": {"min": 0, "max": None},
            "memory": None,
            "total_memory": None,
            "compute_capability": None,
        },
        "disk": {"size": {"min": 100.0, "max": None}},
    }


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        (
            "A100:80GB:2",
            {"name": ["A100"], "memory": {"min": 80.0, "max": 80.0}, "count": {"min": 2, "max": 2}},
        ),
        ("24GB..", {"memory": {"min": 24.0, "max": None}, "count": {"min": 1, "max": None}}),
        ("nvidia:2..", {"vendor": "nvidia", "count": {"min": 2, "max": None}}),
        ("H100,H200:8", {"name": ["H100", "H200"], "count": {"min": 8, "max": 8}}),
        ("8:H100", {"name": ["H100"], "count": {"min": 8, "max": 8}}),
        ("tpu:v5litepod-8", {"vendor": "google", "name": ["v5litepod-8"]}),
        ("amd:MI300X:192GB", {"vendor": "amd", "name": ["MI300X"], "memory": {"min": 192.0, "max": 192.0}}),
        ("A10G", {"name": ["A10G"], "count": {"min": 1, "max": None}}),
        (2, {"count": {"min": 2, "max": 2}}),
        ("0", {"count": {"min": 0, "max": 0}}),
        ({"name": "A100", "compute_capability": 8.0}, {"name": ["A100"], "compute_capability": [8, 0]}),
        ({"total_memory": "1TB.."}, {"total_memory": {"min": 1024.0, "max": None}}),
    ],
)
def test_gpu_shorthand(gpu: Any, expected: dict[str, Any]) -> None:
    dumped = task(resources={"gpu": gpu}).model_dump(mode="json")["resources"]["gpu"]
    assert {k: dumped[k] for k in expected} == expected


@pytest.mark.parametrize(
    ("cpu", "expected"),
    [
        ("1..", {"arch": None, "count": {"min": 1, "max": None}}),
        ("x86:4..", {"arch": "x86", "count": {"min": 4, "max": None}}),
        ("arm:8", {"arch": "arm", "count": {"min": 8, "max": 8}}),
        ("ARM", {"arch": "arm", "count": {"min": 2, "max": None}}),
        (16, {"arch": None, "count": {"min": 16, "max": 16}}),
        ({"min": 4}, {"arch": None, "count": {"min": 4, "max": None}}),
        ({"arch": "arm", "count": "..8"}, {"arch": "arm", "count": {"min": None, "max": 8}}),
    ],
)
def test_cpu_shorthand(cpu: Any, expected: dict[str, Any]) -> None:
    assert task(resources={"cpu": cpu}).model_dump(mode="json")["resources"]["cpu"] == expected


def test_memory_and_disk_shorthands() -> None:
    res = task(resources={"memory": "512MB..1TB", "disk": {"size": "200GB.."}, "shm_size": "16GB"}).resources
    assert res.model_dump(mode="json")["memory"] == {"min": 0.5, "max": 1024.0}
    assert res.model_dump(mode="json")["disk"] == {"size": {"min": 200.0, "max": None}}
    assert res.shm_size == 16.0
    assert task(resources={"disk": 500}).resources.model_dump(mode="json")["disk"] == {
        "size": {"min": 500.0, "max": 500.0}
    }


@pytest.mark.parametrize(
    ("resources", "loc", "text"),
    [
        ({"memory": ".."}, ("resources", "memory"), "invalid empty range"),
        ({"memory": "16GB..8GB"}, ("resources", "memory"), "invalid range order"),
        ({"cpu": "8..2"}, ("resources", "cpu", "count"), "invalid range order"),
        ({"gpu": "A100:xx"}, ("resources", "gpu"), "invalid GPU spec 'A100:xx'"),
        ({"gpu": "A100::2"}, ("resources", "gpu"), "empty token"),
        ({"cpu": "amd64:4"}, ("resources", "cpu"), "neither a count nor x86/arm"),
        ({"disk": "lots"}, ("resources", "disk", "size", "min"), "invalid memory size 'lots'"),
        ({"gpus": 1}, ("resources", "gpus"), "Extra inputs"),
        ({"gpu": {"vendor": "acme"}}, ("resources", "gpu", "vendor"), "unknown GPU vendor"),
    ],
)
def test_resource_errors_carry_the_field_path(resources: dict[str, Any], loc: tuple[str, ...], text: str) -> None:
    with pytest.raises(ValidationError) as info:
        task(resources=resources)
    errors = info.value.errors()
    assert tuple(errors[0]["loc"]) == loc
    assert all(tuple(e["loc"])[:2] == loc[:2] for e in errors)
    assert text in errors[0]["msg"]


def test_unknown_keys_are_rejected_everywhere() -> None:
    assert error_locs({**TASK, "comands": ["x"]}) == [("comands",)]
    assert error_locs({"type": "fleet", "nodes": 1, "ssh_config": {"hosts": ["h"], "x": 1}}) == [("ssh_config", "x")]
    assert error_locs({**TASK, "retry": {"on_event": ["error"]}})[0][:1] == ("retry",)
    assert error_locs({"type": "gateway", "backend": "aws", "region": "r", "router": {}}) == [("router",)]


def test_type_errors_name_the_type_field() -> None:
    assert error_locs({"commands": ["x"]}) == [("type",)]
    assert error_locs({"type": "job"}) == [("type",)]
    with pytest.raises(ValidationError) as info:
        parse_run_configuration({"type": "fleet"})
    assert [tuple(e["loc"]) for e in info.value.errors()] == [("type",)]
    assert error_locs({"type": "volume", "backend": "ceph"}) == [("backend",)]


def test_task_exposes_the_interface_attributes() -> None:
    conf = task(
        name="train",
        image="ubuntu:22.04",
        user="1000:1000",
        working_dir="/w",
        env=["A=1", "B"],
        shell="bash",
        nodes=2,
        ports=[8080, "80:8081", "*:8082"],
        volumes=["data:/data", "/mnt/cache:/cache"],
        repos=["."],
        files=["cfg.yml:/etc/cfg.yml"],
        priority=50,
        idle_duration="off",
        max_duration="2h",
        stop_duration="off",
        fleets=["test-fleet", "other/shared"],
        creation_policy="reuse",
        retry=True,
        spot_policy="auto",
    )
    assert (conf.type, conf.name, conf.image, conf.user, conf.nodes, conf.nodes_num) == (
        "task",
        "train",
        "ubuntu:22.04",
        "1000:1000",
        2,
        2,
    )
    assert conf.commands == ["python train.py"]
    assert conf.env == {"A": "1", "B": EnvSentinel(key="B")}
    assert conf.model_dump(mode="json")["env"] == {"A": "1", "B": {"key": "B"}}
    with pytest.raises(ValueError, match="not all variables are resolved: B"):
        conf.env_dict()
    assert [(p.local_port, p.container_port) for p in conf.ports] == [(8080, 8080), (80, 8081), (None, 8082)]
    dumped = conf.model_dump(mode="json")
    assert dumped["volumes"] == [
        {"name": "data", "path": "/data"},
        {"instance_path": "/mnt/cache", "path": "/cache", "optional": False},
    ]
    assert dumped["repos"][0]["local_path"] == "." and dumped["repos"][0]["if_exists"] == "error"
    assert dumped["files"] == [{"local_path": "cfg.yml", "path": "/etc/cfg.yml"}]
    assert (conf.idle_duration, conf.max_duration, conf.stop_duration) == (-1, 7200, "off")
    assert dumped["fleets"] == [
        {"project": None, "name": "test-fleet"},
        {"project": "other", "name": "shared"},
    ]
    assert conf.priority == 50 and conf.retry is True and conf.privileged is False and conf.docker is None


def test_python_version_as_number_or_string() -> None:
    assert task(python=3.10).model_dump(mode="json")["python"] == "3.10"
    assert task(python="3.12").model_dump(mode="json")["python"] == "3.12"
    assert error_locs({**TASK, "python": "3.8"}) == [("python",)]
    assert error_locs({**TASK, "image": "x", "python": "3.11"}) == [("python",)]


def test_env_forms() -> None:
    assert task(env={"PORT": 8080}).env == {"PORT": "8080"}
    assert task(env=["A=x=y", "B="]).env == {"A": "x=y", "B": ""}
    assert error_locs({**TASK, "env": ["A", "A"]}) == [("env",)]
    assert error_locs({**TASK, "env": ["1A=x"]}) == [("env",)]


def test_commands_or_image_required() -> None:
    assert error_locs({"type": "task"}) == [()]
    assert task(commands=[], image="ubuntu").image == "ubuntu"


def test_fleet_nodes_normalisation_and_target() -> None:
    def nodes(value: Any) -> Any:
        return parse_fleet_configuration({"type": "fleet", "nodes": value}).model_dump(mode="json")["nodes"]

    assert nodes("0..3") == {"min": 0, "max": 3}
    assert nodes(2) == {"min": 2, "max": 2}
    assert nodes("..4") == {"min": 0, "max": 4}
    assert nodes({"min": 1, "target": 2, "max": 3}) == {"min": 1, "target": 2, "max": 3}
    fleet = parse_fleet_configuration({"type": "fleet", "nodes": "1.."})
    assert fleet.nodes is not None and (fleet.nodes.min, fleet.nodes.target, fleet.nodes.max) == (1, 1, None)
    for bad in ("3..1", -1, {"min": 2, "target": 1}, {"target": 5, "max": 3}):
        with pytest.raises(ValidationError) as info:
            parse_fleet_configuration({"type": "fleet", "nodes": bad})
        assert info.value.errors()[0]["loc"][:1] == ("nodes",)


def test_fleet_defaults_and_ssh_form() -> None:
    cloud = parse_fleet_configuration({"type": "fleet", "name": "f", "nodes": 1})
    assert cloud.model_dump(mode="json")["blocks"] == 1 and cloud.ssh_config is None and cloud.resources is None
    ssh = parse_configuration(
        {
            "type": "fleet",
            "ssh_config": {
                "user": "ubuntu",
                "identity_file": "~/.ssh/id",
                "hosts": ["10.0.0.1", {"hostname": "h"}],
            },
            "placement": "cluster",
            "blocks": "auto",
        }
    )
    assert isinstance(ssh, FleetConfiguration) and ssh.is_ssh and ssh.blocks == "auto"


def test_service_normalisation() -> None:
    conf = parse_configuration({"type": "service", "commands": ["x"], "port": 8000, "model": "llama"})
    assert isinstance(conf, ServiceConfiguration)
    dumped = conf.model_dump(mode="json")
    assert dumped["port"] == {"local_port": 80, "container_port": 8000}
    assert dumped["model"] == {"type": "chat", "name": "llama", "format": "openai", "prefix": "/v1"}
    assert conf.replica_groups[0].replicas.min == 1
    groups = parse_configuration(
        {
            "type": "service",
            "port": 8000,
            "replicas": [
                {"count": 1, "commands": ["router"], "router": {"type": "sglang"}},
                {"count": "1..4", "scaling": {"metric": "rps", "target": 2}, "commands": ["w"]},
            ],
        }
    )
    dumped = groups.model_dump(mode="json")
    assert dumped["replicas"] is None and [g["name"] for g in dumped["groups"]] == ["0", "1"]
    assert dumped["groups"][0]["router"] == {"type": "sglang"}


def test_dev_environment_and_other_types() -> None:
    dev = parse_configuration({"type": "dev-environment", "ide": "vscode", "inactivity_duration": "2h"})
    assert isinstance(dev, DevEnvironmentConfiguration) and dev.inactivity_duration == 7200
    assert error_locs({"type": "dev-environment", "entrypoint": "x"}) == [("entrypoint",)]
    gw = parse_gateway_configuration({"type": "gateway", "backend": "aws", "region": "eu-west-1"})
    assert isinstance(gw, GatewayConfiguration) and gw.model_dump(mode="json")["certificate"] == {
        "type": "lets-encrypt"
    }
    vol = parse_volume_configuration({"type": "volume", "backend": "aws", "region": "r", "size": "100GB"})
    assert isinstance(vol, AWSVolumeConfiguration) and vol.size == 100.0


def test_to_requirements() -> None:
    assert ResourcesSpec().to_requirements() == Requirements(
        cpu_arch=None,
        cpu_count=Range(2, None),
        memory=Range(8.0, None),
        disk=Range(100.0, None),
        gpu=GpuSpec(count=Range(0, None)),
    )
    req = task(resources={"gpu": "nvidia:A100:40GB..:2", "cpu": "arm:4..", "disk": None}).resources.to_requirements()
    assert req.cpu_arch == "arm" and req.cpu_count == Range(4, None) and req.disk is None
    assert req.gpu == GpuSpec(vendor="nvidia", names=("A100",), count=Range(2, 2), memory=Range(40.0, None))
    assert ResourcesSpec().describe() == "cpu=2.. mem=8GB.. disk=100GB.. gpu=0.."


def test_profile_parsing_and_selectors() -> None:
    assert parse_profile(None) == Profile()
    profile = parse_profile(
        {
            "name": "p",
            "default": True,
            "instances": ["node-1", {"hostname": "10.0.0.2"}, {"fleet": "other/f", "instance": 0}],
            "retry": {"on_events": ["no-capacity"], "duration": "1d"},
            "schedule": {"cron": "0 8 * * mon-fri"},
            "utilization_policy": {"min_gpu_utilization": 10, "time_window": "30m"},
        }
    )
    dumped = profile.model_dump(mode="json")
    assert dumped["instances"] == [
        {"name": "node-1"},
        {"hostname": "10.0.0.2"},
        {"fleet": {"project": "other", "name": "f"}, "instance": 0},
    ]
    assert dumped["retry"] == {"on_events": ["no-capacity"], "duration": 86400}
    assert dumped["schedule"] == {"cron": ["0 8 * * mon-fri"]}
    assert Profile.model_validate(dumped) == profile
    assert profile.instances is not None
    selector: InstanceSelector = profile.instances[0]
    assert selector.name == "node-1"  # type: ignore[union-attr]
    bad: dict[str, Any]
    assert parse_profile({"instances": []}).instances == []  # existing instances only (the seed PR's meaning)
    for bad in (
        {"fleets": ["a/b/c"]},
        {"schedule": {"cron": "* * *"}},
        {"retry": {"on_events": []}},
    ):
        with pytest.raises(ValidationError):
            parse_profile(bad)


def test_effective_profile_configuration_overrides_profile() -> None:
    profile = parse_profile({"name": "p", "spot_policy": "spot", "max_price": 2.0, "fleets": ["a"]})
    conf = task(spot_policy="on-demand", fleets=["b"])
    merged = effective_profile(profile, conf)
    assert isinstance(merged, ProfileParams)
    assert merged.spot_policy is not None and merged.spot_policy.value == "on-demand"
    assert merged.max_price == 2.0
    assert merged.fleets == [EntityReference(name="b")]
    assert merged.creation_policy is not None and merged.creation_policy.value == "reuse-or-create"
    assert effective_profile(None, task(creation_policy="reuse")).creation_policy.value == "reuse"  # type: ignore[union-attr]
    assert isinstance(effective_profile(None, task(retry={"duration": "1h"})).retry, RetrySpec)


def test_load_configuration_file_errors(tmp_path: Path) -> None:
    good = tmp_path / "ok.dstack.yml"
    good.write_text("type: task\ncommands:\n  - echo hi\nresources:\n  gpu: A100:80GB:2\n")
    assert isinstance(load_configuration_file(good), TaskConfiguration)

    bad = tmp_path / "bad.dstack.yml"
    bad.write_text("type: task\ncommands: [x]\nresources:\n  gpu: A100:xx\n  mem: 8GB\n")
    with pytest.raises(ConfigError) as info:
        load_configuration_file(bad)
    lines = str(info.value).splitlines()
    assert lines[0].startswith("resources.gpu: invalid GPU spec 'A100:xx'")
    assert lines[1] == "resources.mem: unknown field; remove it or check its spelling"
    assert info.value.path == bad

    broken = tmp_path / "broken.dstack.yml"
    broken.write_text("type: task\ncommands: [x\n")
    with pytest.raises(ConfigError, match=r"invalid YAML in .*broken.dstack.yml: line \d+, column \d+"):
        load_configuration_file(broken)
    nested = tmp_path / "nested.dstack.yml"
    nested.write_text("type: task\ncommands: [x]\nvolumes:\n  - name: v\n    path: rel\n")
    with pytest.raises(ConfigError, match=r"volumes\[0\]"):
        load_configuration_file(nested)
