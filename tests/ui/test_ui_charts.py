"""The run page's metrics charts from a ``metrics/job`` answer: CPU % per CPU, memory against the job's
memory, each GPU's use and memory; drawn oldest first in the chart's box; nothing from fewer than two samples."""

from __future__ import annotations

from corral.ui.charts import HEIGHT, WIDTH, charts_of


def series(name: str, values: list[float]) -> dict[str, object]:
    return {"name": name, "timestamps": ["t"] * len(values), "values": values}


def test_charts_scale_each_series_and_draw_oldest_first() -> None:
    answer = {
        "metrics": [
            series("cpu_usage_percent", [400, 200, 0]),  # newest first: 4 CPUs fully used now
            series("cpus_detected_num", [4, 4, 4]),
            series("memory_working_set_bytes", [8e9, 4e9, 2e9]),
            series("memory_total_bytes", [16e9, 16e9, 16e9]),
            series("gpus_detected_num", [1, 1, 1]),
            series("gpu_memory_total_bytes", [80e9] * 3),
            series("gpu_util_percent_gpu0", [90, 50, 10]),
            series("gpu_memory_usage_bytes_gpu0", [40e9, 20e9, 0]),
        ]
    }
    charts = {c.title: c for c in charts_of(answer)}
    assert list(charts) == ["CPU", "Memory", "GPU 0", "GPU 0 memory"]
    assert charts["CPU"].latest == "100%" and charts["CPU"].label == "CPU use, now 100% of 4 CPUs"
    assert charts["Memory"].latest == "8.0 GB of 16.0 GB"
    first, *_, last = [tuple(float(x) for x in p.split(",")) for p in charts["CPU"].points.split()]
    assert first == (0.0, HEIGHT - 1) and last == (WIDTH, 1.0)  # 0% at the left (oldest), 100% at the right
    mem = [tuple(float(x) for x in p.split(",")) for p in charts["Memory"].points.split()]
    assert mem[-1][1] == HEIGHT - 0.5 * (HEIGHT - 2) - 1  # half of the job's memory


def test_no_samples_no_charts() -> None:
    assert charts_of({"metrics": []}) == []
