"""GPU model names as a Slurm backend's ``gpu_partitions`` gives them (dstack's ``[vendor:]name[:memory]``)."""

from __future__ import annotations

import pytest

from corral.domain.gpu_models import GpuModel, parse_gpu_model


@pytest.mark.parametrize(
    ("text", "model"),
    [
        ("H100", GpuModel("nvidia", "H100", 80 * 1024)),
        ("h100", GpuModel("nvidia", "H100", 80 * 1024)),
        ("RTX 4090", GpuModel("nvidia", "RTX4090", 24 * 1024)),
        ("A100:40GB", GpuModel("nvidia", "A100", 40 * 1024)),
        ("A100:80gb", GpuModel("nvidia", "A100", 80 * 1024)),
        ("MI300X", GpuModel("amd", "MI300X", 192 * 1024)),
        ("amd:MI300X", GpuModel("amd", "MI300X", 192 * 1024)),
        ("nvidia:X:80GB", GpuModel("nvidia", "X", 80 * 1024)),
        ("NVIDIA:H200:141GB", GpuModel("nvidia", "H200", 141 * 1024)),
    ],
)
def test_known_and_whole_names(text: str, model: GpuModel) -> None:
    assert parse_gpu_model(text) == model


def test_a_model_prints_whole() -> None:
    assert str(parse_gpu_model("A100:80GB")) == "nvidia:A100:80GB"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("A100", "multiple matching GPU models found"),
        ("V100", "multiple matching GPU models found"),
        ("X1000", "not a known GPU model"),
        ("amd:H100", "not a known GPU model"),
        ("A100:96GB", "not a known GPU model"),
        ("A100:big", "the second field is a vendor's name or a memory size"),
        ("acme:X:80GB", "vendor:name:memory"),
        ("nvidia:X:lots", "vendor:name:memory"),
        ("a:b:c:d", "is not a GPU model"),
        ("", "is not a GPU model"),
        ("nvidia:", "is not a GPU model"),
    ],
)
def test_bad_names(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_gpu_model(text)
