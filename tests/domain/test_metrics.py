"""dstack's job metric series from stored samples (newest first) and the retention cut-offs."""

from __future__ import annotations

from corral.domain.metrics import JobResources, MetricsPoint, Series, cpu_percent, job_series, retention_cutoffs


def _point(t: int, cpu: int, gpus_mem: tuple[int, ...] = (), gpus_util: tuple[int, ...] = ()) -> MetricsPoint:
    return MetricsPoint(t, cpu, memory_usage_bytes=t * 10, memory_working_set_bytes=t * 5,
                        gpus_memory_usage_bytes=gpus_mem, gpus_util_percent=gpus_util)  # fmt: skip


def _by_name(series: list[Series]) -> dict[str, tuple[object, ...]]:
    return {s.name: s.values for s in series}


def test_cpu_percent_is_cpu_time_over_wall_time_and_exceeds_100_on_several_cores() -> None:
    assert cpu_percent(_point(2_000_000, 1_500_000), _point(1_000_000, 1_000_000)) == 50
    assert cpu_percent(_point(2_000_000, 3_000_000), _point(1_000_000, 1_000_000)) == 200


def test_cpu_percent_is_zero_for_an_empty_window_or_a_counter_that_went_back() -> None:
    assert cpu_percent(_point(1_000_000, 5), _point(1_000_000, 0)) == 0
    assert cpu_percent(_point(2_000_000, 0), _point(1_000_000, 900_000)) == 0


def test_fewer_than_two_samples_give_no_series() -> None:
    assert job_series([], JobResources()) == []
    assert job_series([_point(1, 1)], JobResources(cpus=2)) == []


def test_every_series_has_one_value_per_sample_but_the_oldest() -> None:
    points = [_point(3_000_000, 2_000_000), _point(2_000_000, 1_000_000), _point(1_000_000, 1_000_000)]
    series = job_series(points, JobResources())
    assert all(s.timestamps_micro == (3_000_000, 2_000_000) for s in series)
    assert _by_name(series) == {
        "cpu_usage_percent": (100, 0),
        "memory_usage_bytes": (30_000_000, 20_000_000),
        "memory_working_set_bytes": (15_000_000, 10_000_000),
        "gpus_detected_num": (0, 0),
    }


def test_the_offer_gives_constant_series_and_each_gpu_its_own() -> None:
    points = [_point(2, 0, (10, 20), (50, 60)), _point(1, 0, (11, 21), (51, 61)), _point(0, 0, (0, 0), (0, 0))]
    values = _by_name(job_series(points, JobResources(cpus=8, memory_bytes=64, gpu_memory_bytes=80)))
    assert values["cpus_detected_num"] == (8, 8)
    assert values["memory_total_bytes"] == (64, 64)
    assert values["gpus_detected_num"] == (2, 2)
    assert values["gpu_memory_total_bytes"] == (80, 80)
    assert values["gpu_memory_usage_bytes_gpu0"] == (10, 11)
    assert values["gpu_memory_usage_bytes_gpu1"] == (20, 21)
    assert values["gpu_util_percent_gpu1"] == (60, 61)


def test_no_gpu_memory_total_without_gpus() -> None:
    values = _by_name(job_series([_point(2, 0), _point(1, 0)], JobResources(gpu_memory_bytes=80)))
    assert "gpu_memory_total_bytes" not in values and values["gpus_detected_num"] == (0,)


def test_a_gpu_count_that_changes_within_the_window_drops_every_gpu_series() -> None:
    points = [_point(3, 0, (1, 2), (1, 2)), _point(2, 0, (1,), (1,)), _point(1, 0)]
    names = set(_by_name(job_series(points, JobResources(cpus=1, gpu_memory_bytes=80))))
    assert names == {"cpu_usage_percent", "memory_usage_bytes", "memory_working_set_bytes", "cpus_detected_num"}


def test_retention_cutoffs_are_now_minus_each_ttl_in_microseconds() -> None:
    assert retention_cutoffs(10_000.0, 3600.0, 7200.0) == (6_400_000_000, 2_800_000_000)
