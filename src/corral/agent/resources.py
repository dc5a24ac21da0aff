"""Host resource detection: CPUs, memory, the work dir's disk size, GPUs, arch, Docker, addresses.

Everything is best effort and never raises: a missing or failing ``nvidia-smi`` means zero NVIDIA
GPUs, a Docker engine that does not answer on its socket within 3 s means no container runtime.
GPU names are normalised to dstack's short names (``NVIDIA H200`` -> ``H200``, ``NVIDIA GeForce
RTX 4090`` -> ``RTX4090``, ``NVIDIA RTX A6000`` -> ``A6000``), the same conversion dstack applies to
what its shim reports for SSH fleets.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from typing import Any

from . import nvidia_csv
from .docker import Docker, DockerError
from .protocol import AGENT_VERSION, GpuDriver, GpuInfo, HostInfo

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=name,memory.total,driver_version",
    "--format=csv,noheader,nounits",
]


def _run(argv: list[str], timeout: float) -> str | None:
    """stdout of a command that exited 0 within ``timeout``, else None."""
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, *argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.decode("utf-8", "replace")


def cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def memory_mib() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024))
    except (ValueError, OSError, AttributeError):
        return 0


def disk_size_mib(path: str) -> int:
    """The size (not the free space) of the file system holding ``path``."""
    try:
        return int(shutil.disk_usage(path).total // (1024 * 1024))
    except OSError:
        return 0


def cpu_arch() -> str:
    machine = platform.machine().lower()
    if machine.startswith(("aarch64", "arm")):
        return "arm"
    return "x86"  # dstack knows only x86 and arm


def convert_nvidia_gpu_name(name: str) -> str:
    """nvidia-smi's product name -> dstack's short name."""
    for prefix in ("NVIDIA ", "Tesla ", "Quadro ", "GeForce "):
        name = name.replace(prefix, "")
    if "GH200" in name:
        return "GH200"
    if "RTX A" in name:
        m = re.search(r"A\d+", name.replace("RTX A", "A"))
        return m.group(0) if m else name.replace(" ", "")
    for old, new in ((" Ti", "Ti"), (" NVL", "NVL"), (" Ada Generation", "Ada"), ("RTX ", "RTX")):
        name = name.replace(old, new)
    m = re.search(r"[AHLPTV]\d+\w*", name)
    return m.group(0) if m else name.replace(" ", "")


_AMD_MARKET_NAME = re.compile(r"^(?:AMD )?(?:Instinct )?(?P<name>MI\d{1,3}[A-Z]?(?:-\w+)?)(?:\s|$)", re.I)


def convert_amd_gpu_name(name: str) -> str:
    m = _AMD_MARKET_NAME.search(name)
    if m:
        name = m.group("name")
    return "MI300X" if name == "MI300X-O" else name


def nvidia_gpus() -> tuple[list[GpuInfo], GpuDriver | None]:
    out = _run(NVIDIA_SMI_QUERY, timeout=15)
    if out is None:
        return [], None
    gpus: list[GpuInfo] = []
    driver: GpuDriver | None = None
    for line in out.splitlines():
        parts = nvidia_csv.fields(line)
        mem = nvidia_csv.number(parts[1]) if len(parts) >= 3 and parts[0] else None
        if mem is None:
            continue
        gpus.append(GpuInfo(name=convert_nvidia_gpu_name(parts[0]), memory_mib=int(mem), vendor="nvidia"))
        if driver is None and parts[2]:
            driver = GpuDriver(vendor="nvidia", version=parts[2])
    return gpus, driver


def _amd_vram_mib(vram: Any) -> int:
    size = vram.get("size") if isinstance(vram, dict) else None
    if isinstance(size, dict):
        value, unit = size.get("value"), str(size.get("unit", "MB"))
    else:
        m = re.match(r"\s*(\d+(?:\.\d+)?)\s*(\w*)", str(size or ""))
        value, unit = (m.group(1), m.group(2) or "MB") if m else (None, "MB")
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0
    return int(v * 1024) if unit.upper().startswith("G") else int(v)


def amd_gpus() -> tuple[list[GpuInfo], GpuDriver | None]:
    """Best effort: ``amd-smi static --asic --vram --driver --json``."""
    out = _run(["amd-smi", "static", "--asic", "--vram", "--driver", "--json"], timeout=15)
    if out is None:
        return [], None
    try:
        data = json.loads(out)
    except ValueError:
        return [], None
    if isinstance(data, dict):
        data = data.get("gpu_data", [data])
    gpus: list[GpuInfo] = []
    driver: GpuDriver | None = None
    for item in data if isinstance(data, list) else []:
        if not isinstance(item, dict):
            continue
        asic = item.get("asic") or {}
        name = asic.get("market_name") if isinstance(asic, dict) else None
        if not isinstance(name, str) or not name:
            continue
        gpus.append(GpuInfo(name=convert_amd_gpu_name(name), memory_mib=_amd_vram_mib(item.get("vram")), vendor="amd"))
        drv = item.get("driver")
        if driver is None and isinstance(drv, dict) and drv.get("version"):
            driver = GpuDriver(vendor="amd", version=str(drv["version"]))
    return gpus, driver


def container_runtime(docker_host: str | None = None) -> str | None:
    """``"docker"`` if the Docker engine at ``docker_host`` (else ``DOCKER_HOST``, else the default
    socket) answers within 3 s."""
    try:
        Docker(docker_host).version(timeout=3.0)
    except DockerError:
        return None
    return "docker"


def ipv4_addresses() -> list[str]:
    """Non-loopback IPv4 addresses of this host (``ip -j -4 addr``, else resolver fallback)."""
    addrs: list[str] = []
    out = _run(["ip", "-j", "-4", "addr", "show"], timeout=3)
    if out:
        try:
            for iface in json.loads(out):
                for a in iface.get("addr_info", []):
                    local = a.get("local")
                    if isinstance(local, str) and not local.startswith("127."):
                        addrs.append(local)
        except (ValueError, AttributeError, TypeError):
            addrs = []
    if not addrs:
        try:
            infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
            for info in infos:
                ip = str(info[4][0])
                if not ip.startswith("127.") and ip not in addrs:
                    addrs.append(ip)
        except OSError:
            pass
    return addrs


def detect_host_info(work_dir: str, runtime: str | None) -> HostInfo:
    gpus, driver = nvidia_gpus()
    if not gpus:
        gpus, driver = amd_gpus()
    return HostInfo(
        hostname=socket.gethostname(),
        cpus=cpu_count(),
        memory_mib=memory_mib(),
        disk_size_mib=disk_size_mib(work_dir),
        cpu_arch=cpu_arch(),
        gpus=gpus,
        gpu_driver=driver,
        container_runtime=runtime,
        agent_version=AGENT_VERSION,
        python_version=platform.python_version(),
        addresses=ipv4_addresses(),
    )


if __name__ == "__main__":  # pragma: no cover - manual check
    json.dump(detect_host_info(os.getcwd(), container_runtime()).to_dict(), sys.stdout, indent=2)
