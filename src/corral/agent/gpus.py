"""The GPUs an agent is restricted to (``serve --gpus 1,3``), for a host split into instances.

A local instance owns some of the machine's GPUs, by their index in ``nvidia-smi``'s (or
``amd-smi``'s) order. Its agent is started with ``--gpus`` and then reports only those GPUs in its
host info, gives containers only those devices, and has host-process jobs see only them (the CUDA,
NVIDIA and ROCm visible-devices variables). Without ``--gpus`` the agent uses all the host's GPUs.
Standard library only.
"""

from __future__ import annotations

from dataclasses import replace

from .protocol import HostInfo


def parse_gpus(value: str) -> tuple[int, ...]:
    """``"1,3"`` -> (1, 3); ``"none"`` or ``""`` -> () (no GPU at all). Raises ValueError naming the flag."""
    text = value.strip()
    if text in ("", "none"):
        return ()
    out: list[int] = []
    for part in text.split(","):
        p = part.strip()
        if not p.isdigit():
            raise ValueError(f"--gpus {value!r}: expected GPU indexes separated by commas (e.g. --gpus 0,2) or 'none'")
        if int(p) in out:
            raise ValueError(f"--gpus {value!r}: GPU {int(p)} is given twice")
        out.append(int(p))
    return tuple(out)


def restrict(info: HostInfo, allowed: tuple[int, ...] | None) -> tuple[HostInfo, list[int]]:
    """The host info with only the ``allowed`` GPUs (None: all), and their indexes on the host."""
    indexes = list(range(len(info.gpus))) if allowed is None else [i for i in allowed if 0 <= i < len(info.gpus)]
    gpus = [info.gpus[i] for i in indexes]
    return replace(info, gpus=gpus, gpu_driver=info.gpu_driver if gpus else None), indexes


def visible_devices_env(indexes: list[int], vendors: list[str]) -> dict[str, str]:
    """What a host-process job of a restricted agent sees: only its GPUs, numbered as ``nvidia-smi``
    numbers them (``CUDA_DEVICE_ORDER=PCI_BUS_ID``), or none (an empty list hides them all)."""
    ids = ",".join(str(i) for i in indexes)
    env = {"CUDA_VISIBLE_DEVICES": ids, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NVIDIA_VISIBLE_DEVICES": ids or "void"}
    if "amd" in vendors or not indexes:
        env.update(ROCR_VISIBLE_DEVICES=ids, HIP_VISIBLE_DEVICES=ids)
    return env
