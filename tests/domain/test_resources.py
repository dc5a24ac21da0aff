"""Property tests for the resource grammar (parse(format(x)) == x, in the pure domain helpers and
through the pydantic models) and for `match_requirements` (widening a requirement never turns a
fit into a misfit; an instance built from the minimums fits)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.config import ResourcesSpec
from corral.domain.durations import format_duration, parse_duration, parse_idle_duration, parse_off_duration
from corral.domain.resources import (
    GPU_VENDOR_ALIASES,
    GPU_VENDORS,
    Gpu,
    GpuSpec,
    InstanceResources,
    Range,
    Requirements,
    describe,
    format_cpu_spec,
    format_gpu_spec,
    format_number,
    format_range,
    match_requirements,
    parse_cpu_spec,
    parse_gpu_spec,
    parse_int_range,
    parse_memory,
    parse_memory_range,
)

counts = st.integers(min_value=0, max_value=10**6)
sizes = st.floats(min_value=0, max_value=1e7, allow_nan=False, allow_infinity=False)


def ranges(values: st.SearchStrategy[float]) -> st.SearchStrategy[Range]:  # type: ignore[type-arg]
    def build(a: float | None, b: float | None) -> Range:  # type: ignore[type-arg]
        if a is not None and b is not None and a > b:
            a, b = b, a
        return Range(a, b)

    return st.builds(build, st.none() | values, st.none() | values).filter(
        lambda r: r.min is not None or r.max is not None
    )


int_ranges = ranges(counts)
mem_ranges = ranges(sizes)
vendors = st.sampled_from(GPU_VENDORS)
reserved = {v.lower() for v in (*GPU_VENDORS, *GPU_VENDOR_ALIASES)}
gpu_names = st.from_regex(r"[A-Za-z][A-Za-z0-9\-]{0,8}", fullmatch=True).filter(
    lambda n: n.lower() not in reserved and not n.startswith("tpu-")
)
gpu_specs = st.builds(
    GpuSpec,
    vendor=st.none() | vendors,
    names=st.none() | st.lists(gpu_names, min_size=1, max_size=3).map(tuple),
    count=int_ranges,
    memory=st.none() | mem_ranges,
)


@given(int_ranges)
def test_int_range_round_trip(rng: Range[int]) -> None:
    text = format_range(rng)
    assert parse_int_range(text) == rng
    assert ResourcesSpec.model_validate({"cpu": {"count": text}}).cpu.count.to_domain() == rng


@given(mem_ranges)
def test_memory_range_round_trip(rng: Range[float]) -> None:
    text = format_range(rng, "GB")
    assert parse_memory_range(text) == rng
    assert ResourcesSpec.model_validate({"memory": text}).memory.to_domain() == rng
    assert ResourcesSpec.model_validate({"disk": text}).to_requirements().disk == rng


@given(sizes)
def test_memory_units(gb: float) -> None:
    assert parse_memory(f"{gb!r}GB") == gb
    assert parse_memory(f"{gb * 1024!r}MB") == pytest.approx(gb)
    assert parse_memory(f"{gb / 1024!r}TB") == pytest.approx(gb)


@given(gpu_specs)
def test_gpu_spec_round_trip(spec: GpuSpec) -> None:
    text = format_gpu_spec(spec)
    assert parse_gpu_spec(text) == spec
    parsed = ResourcesSpec.model_validate({"gpu": text}).gpu
    assert parsed is not None and parsed.to_domain() == spec


@given(st.none() | st.sampled_from(["x86", "arm"]), int_ranges)
def test_cpu_spec_round_trip(arch: str | None, count: Range[int]) -> None:
    text = format_cpu_spec(arch, count)
    assert parse_cpu_spec(text) == (arch, count)
    req = ResourcesSpec.model_validate({"cpu": text}).to_requirements()
    assert (req.cpu_arch, req.cpu_count) == (arch, count)


@given(st.integers(min_value=0, max_value=10**9))
def test_duration_round_trip(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_duration_grammar() -> None:
    assert [parse_duration(v) for v in (90, "90", "30m", "2h", "1d", "1w", "5 m")] == [
        90,
        90,
        1800,
        7200,
        86400,
        604800,
        300,
    ]
    assert (parse_off_duration("off"), parse_off_duration(False), parse_off_duration(True)) == (
        "off",
        "off",
        None,
    )
    assert (parse_idle_duration("off"), parse_idle_duration(-1), parse_idle_duration("1h")) == (-1, -1, 3600)
    for bad in ("1.5h", "2x", "", "m"):
        with pytest.raises(ValueError, match="cannot parse the duration"):
            parse_duration(bad)
    with pytest.raises(ValueError, match="negative"):
        parse_off_duration(-5)


@pytest.mark.parametrize("text", ["..", "8..2", "1..2..3", "x", "2.5"])
def test_bad_int_ranges(text: str) -> None:
    with pytest.raises(ValueError):
        parse_int_range(text)


@pytest.mark.parametrize("text", ["A100:xx", "A100::2", "nvidia:amd", "2:3", ":"])
def test_bad_gpu_specs(text: str) -> None:
    with pytest.raises(ValueError, match="invalid GPU spec"):
        parse_gpu_spec(text)


# ---------------------------------------------------------------- matching

gpus = st.builds(
    Gpu,
    name=st.sampled_from(["A100", "H100", "MI300X"]),
    memory_mib=st.integers(1024, 200 * 1024),
    vendor=st.sampled_from(["nvidia", "amd"]),
)
instances = st.builds(
    InstanceResources,
    cpus=st.integers(1, 256),
    memory_mib=st.integers(512, 2 * 1024 * 1024),
    gpus=st.lists(gpus, max_size=8).map(tuple),
    disk_size_mib=st.integers(0, 4 * 1024 * 1024),
    cpu_arch=st.none() | st.sampled_from(["x86", "arm"]),
)
small_int_ranges = ranges(st.integers(0, 16))
small_mem_ranges = ranges(st.floats(0, 4096, allow_nan=False))
requirements = st.builds(
    Requirements,
    cpu_arch=st.none() | st.sampled_from(["x86", "arm"]),
    cpu_count=small_int_ranges,
    memory=small_mem_ranges,
    disk=st.none() | small_mem_ranges,
    gpu=st.none()
    | st.builds(
        GpuSpec,
        vendor=st.none() | st.sampled_from(["nvidia", "amd"]),
        names=st.none() | st.sampled_from([("A100",), ("H100", "A100"), ("mi300x",)]),
        count=small_int_ranges,
        memory=st.none() | small_mem_ranges,
        total_memory=st.none() | small_mem_ranges,
    ),
)


def _widen(rng: Range, lower: bool, upper: bool) -> Range:  # type: ignore[type-arg]
    return Range(None if lower else rng.min, None if upper else rng.max)


def widen(req: Requirements, data: st.DataObject) -> Requirements:
    flag = st.booleans()
    gpu = req.gpu
    if gpu is not None:
        gpu = dataclasses.replace(
            gpu,
            vendor=None if data.draw(flag) else gpu.vendor,
            names=None if data.draw(flag) else gpu.names,
            count=_widen(gpu.count, data.draw(flag), data.draw(flag)),
            memory=None if data.draw(flag) else gpu.memory,
            total_memory=None if data.draw(flag) else gpu.total_memory,
        )
    return Requirements(
        cpu_arch=None if data.draw(flag) else req.cpu_arch,
        cpu_count=_widen(req.cpu_count, data.draw(flag), data.draw(flag)),
        memory=_widen(req.memory, data.draw(flag), data.draw(flag)),
        disk=None if data.draw(flag) else req.disk,
        gpu=None if data.draw(flag) else gpu,
    )


@given(requirements, instances, st.data())
def test_widening_requirements_never_breaks_a_fit(
    req: Requirements, res: InstanceResources, data: st.DataObject
) -> None:
    wider = widen(req, data)
    if match_requirements(req, res) is None:
        assert match_requirements(wider, res) is None
    if match_requirements(wider, res) is not None:
        assert match_requirements(req, res) is not None


@given(requirements, instances)
def test_reason_names_what_does_not_fit(req: Requirements, res: InstanceResources) -> None:
    reason = match_requirements(req, res)
    assert reason is None or (reason.startswith("needs ") and "instance" in reason)


def test_match_examples() -> None:
    box = InstanceResources(
        cpus=16,
        memory_mib=64 * 1024,
        gpus=(Gpu("A100", 80 * 1024),) * 2,
        disk_size_mib=500 * 1024,
        cpu_arch="x86",
    )
    assert match_requirements(Requirements(), box) is None
    assert match_requirements(Requirements(gpu=parse_gpu_spec("A100:80GB:2")), box) is None
    assert match_requirements(Requirements(gpu=parse_gpu_spec("H100")), box) == "needs gpu H100, instance has A100"
    assert match_requirements(Requirements(gpu=parse_gpu_spec("4")), box) == "needs gpu count 4, instance has 2"
    small = dataclasses.replace(box, memory_mib=4 * 1024, gpus=())
    assert match_requirements(Requirements(), small) == "needs memory 8GB.., instance has 4.0GB"
    cpu_only = dataclasses.replace(box, gpus=())
    assert match_requirements(Requirements(gpu=parse_gpu_spec("A100:0..")), cpu_only) is None
    assert match_requirements(Requirements(gpu=parse_gpu_spec("A100")), cpu_only) is not None
    assert match_requirements(Requirements(cpu_arch="arm"), box) == "needs cpu arch arm, instance is x86"


def test_describe() -> None:
    assert describe(Requirements()) == "cpu=2.. mem=8GB.. disk=100GB.. gpu=0.."
    req = Requirements(cpu_arch="arm", cpu_count=Range(4, 4), gpu=parse_gpu_spec("nvidia:A100:40GB..:2"), disk=None)
    assert describe(req) == "cpu=arm:4 mem=8GB.. gpu=A100:40GB..:2"


def test_a_duration_is_a_number_or_a_string_and_offable_ones_are_never_negative() -> None:
    with pytest.raises(ValueError, match=r"cannot parse the duration \[1\]"):
        parse_duration([1])
    assert parse_off_duration("90") == 90
    assert parse_off_duration(0) == 0
    with pytest.raises(ValueError, match="duration cannot be negative"):
        parse_off_duration(-5)
    assert parse_idle_duration(True) is None and parse_idle_duration(None) is None
    assert parse_idle_duration("2h") == 7200 and parse_idle_duration(-7) == -7


def test_a_range_prints_as_its_shorthand() -> None:
    assert str(Range(2, 8)) == format_range(Range(2, 8))
    assert str(Range(2, None)) == "2.."


def test_memory_is_a_number_of_gb_or_a_size_with_a_unit() -> None:
    assert parse_memory(" 16 ") == 16.0
    assert parse_memory("512MB") == 0.5
    for bad in ("lots", "16XB", None, [16]):
        with pytest.raises(ValueError, match="invalid memory size"):
            parse_memory(bad)


def test_ranges_are_shorthands_or_plain_values() -> None:
    assert parse_int_range(4) == Range(4, 4)
    assert parse_int_range("3") == Range(3, 3)
    with pytest.raises(ValueError, match=r"invalid range \{'min': 1\}"):
        parse_int_range({"min": 1})
    with pytest.raises(ValueError, match=r"invalid memory range \[16\]"):
        parse_memory_range([16])


def test_cpu_shorthands_refuse_empty_unknown_and_repeated_tokens() -> None:
    assert parse_cpu_spec("ARM:8") == ("arm", Range(8, 8))
    with pytest.raises(ValueError, match="empty token"):
        parse_cpu_spec("arm:")
    with pytest.raises(ValueError, match="'risc' is neither a count nor x86/arm"):
        parse_cpu_spec("risc:4")
    with pytest.raises(ValueError, match="more than one count given"):
        parse_cpu_spec("4:8")
    with pytest.raises(ValueError, match="more than one arch given"):
        parse_cpu_spec("x86:arm")


def test_a_gpu_shorthand_refuses_an_empty_name() -> None:
    with pytest.raises(ValueError, match="empty GPU name in 'A100,'"):
        parse_gpu_spec("A100,:2")


def test_numbers_that_are_not_finite_print_as_python_writes_them() -> None:
    assert format_number(float("inf")) == "inf"
    assert format_number(float("nan")) == "nan"
    assert format_number(8) == "8" and format_number(8.0) == "8"


def test_describe_shows_total_gpu_memory_and_compute_capability_and_omits_no_gpu() -> None:
    gpu = GpuSpec(names=("H100",), count=Range(2, 2), total_memory=Range(160.0, None), compute_capability=(9, 0))
    req = Requirements(cpu_count=Range(4, None), memory=Range(8.0, None), disk=None, gpu=gpu)
    assert describe(req) == "cpu=4.. mem=8GB.. gpu=H100:2:160GB..:9.0"
    assert describe(Requirements(disk=None, gpu=None)) == "cpu=2.. mem=8GB.."


def test_an_instance_is_refused_for_its_disk_gpu_memory_or_total_gpu_memory() -> None:
    gpus = (Gpu("A100", 40 * 1024),) * 2
    res = InstanceResources(cpus=8, memory_mib=65536, gpus=gpus, disk_size_mib=50 * 1024)
    base = Requirements(cpu_count=Range(1, None), memory=Range(1.0, None), disk=None)
    assert match_requirements(Requirements(cpu_count=Range(1, None), memory=Range(1.0, None)), res) == (
        "needs disk 100GB.., instance has 50.0GB"
    )
    per_gpu = replace(base, gpu=GpuSpec(count=Range(1, None), memory=Range(80.0, None)))
    assert match_requirements(per_gpu, res) == "needs gpu memory 80GB.., instance has 40.0GB"
    total = replace(base, gpu=GpuSpec(count=Range(1, None), total_memory=Range(100.0, None)))
    assert match_requirements(total, res) == "needs total gpu memory 100GB.., instance has 80.0GB"
    assert match_requirements(replace(total, gpu=GpuSpec(total_memory=Range(80.0, None))), res) is None


def test_a_disk_of_unknown_size_fits_any_disk_requirement() -> None:
    """A Slurm node's disk is not known (0): dstack does not match the disk requirement against it."""
    unknown = InstanceResources(cpus=4, memory_mib=16000)
    assert match_requirements(Requirements(cpu_count=Range(1, None), memory=Range(1.0, None)), unknown) is None


def test_an_instance_is_refused_for_its_gpu_vendor_naming_it() -> None:
    res = InstanceResources(cpus=8, memory_mib=65536, gpus=(Gpu("MI300X", 192 * 1024, vendor="amd"),))
    req = Requirements(cpu_count=Range(1, None), memory=Range(1.0, None), disk=None, gpu=parse_gpu_spec("nvidia:1"))
    assert match_requirements(req, res) == "needs gpu vendor nvidia, instance has amd"


def test_a_compute_capability_is_a_minimum_only_a_known_nvidia_model_meets() -> None:
    # Compute capabilities as NVIDIA lists them (developer.nvidia.com/cuda-gpus): T4 7.5, A100 8.0, H100 9.0.
    def fits(gpu: Gpu, cc: tuple[int, int]) -> str | None:
        res = InstanceResources(cpus=8, memory_mib=65536, gpus=(gpu,))
        spec = GpuSpec(count=Range(1, None), compute_capability=cc)
        return match_requirements(
            Requirements(cpu_count=Range(1, None), memory=Range(1.0, None), disk=None, gpu=spec), res
        )

    assert fits(Gpu("A100", 80 * 1024), (8, 0)) is None
    assert fits(Gpu("h100", 80 * 1024), (8, 6)) is None
    assert fits(Gpu("T4", 16 * 1024), (8, 0)) == "needs gpu compute capability 8.0+, instance has T4 (7.5)"
    unknown = "needs gpu compute capability 7.0+, instance has {} (an unknown one)"
    assert fits(Gpu("FutureGPU", 80 * 1024), (7, 0)) == unknown.format("FutureGPU")
    assert fits(Gpu("MI300X", 192 * 1024, vendor="amd"), (7, 0)) == unknown.format("MI300X")


def test_durations_print_in_their_largest_exact_unit() -> None:
    assert [format_duration(s) for s in (0, -5, 45, 90, 120, 7200, 86400, 604800, 1209600, 90000)] == [
        "0s",
        "-5s",
        "45s",
        "90s",
        "2m",
        "2h",
        "1d",
        "1w",
        "2w",
        "25h",
    ]


def test_memory_in_numbers_and_terabytes_is_gb() -> None:
    assert parse_memory(16) == 16.0 and parse_memory(0.5) == 0.5
    assert parse_memory("1TB") == 1024.0


def test_cpu_and_gpu_shorthands_print_as_users_write_them() -> None:
    assert format_cpu_spec("arm", Range(4, 8)) == "arm:4..8"
    assert format_cpu_spec(None, Range(2, None)) == "2.."
    assert format_gpu_spec(
        GpuSpec(vendor="nvidia", names=("A100", "H100"), memory=Range(80.0, None), count=Range(2, None))
    ) == ("nvidia:A100,H100:80GB..:2..")
    assert format_gpu_spec(GpuSpec(count=Range(1, 1))) == "1"
    assert parse_gpu_spec(format_gpu_spec(parse_gpu_spec("A100:40GB..80GB:1..2"))) == parse_gpu_spec(
        "A100:40GB..80GB:1..2"
    )


def test_without_a_gpu_requirement_any_gpus_do() -> None:
    res = InstanceResources(cpus=8, memory_mib=65536, gpus=(Gpu("H100", 81920),), disk_size_mib=200 * 1024)
    assert match_requirements(Requirements(gpu=None), res) is None


def test_a_run_s_idle_duration_and_the_shorter_of_the_fleet_s_and_the_run_s() -> None:
    from corral.domain.durations import run_idle_duration, shorter_idle

    assert run_idle_duration({"configuration": {"idle_duration": "1m"}, "profile": {"idle_duration": 5}}) == 60
    assert run_idle_duration({"configuration": {}, "profile": {"idle_duration": "off"}}) == -1
    assert run_idle_duration({"configuration": None, "profile": None}) is None
    assert run_idle_duration({"configuration": {"idle_duration": "soon"}}) is None
    # -1 is `off`: no limit, so the other one is the shorter
    assert [shorter_idle(f, r) for f, r in ((300, None), (None, 60), (-1, 60), (300, -1), (300, 60), (30, 60))] == [
        300, 60, 60, 300, 60, 30,
    ]  # fmt: skip
