"""How long an idle instance stays: its own idle_duration, else 0 on Slurm (an allocation ends with its job),
else the server's default."""

from __future__ import annotations

from corral.domain.durations import idle_limit


def test_idle_limit() -> None:
    assert idle_limit(600.0, "slurm", 300.0) == 600.0
    assert idle_limit(None, "slurm", 300.0) == 0.0
    assert idle_limit(None, "aws", 300.0) == 300.0
    assert idle_limit(-1.0, "aws", 300.0) == -1.0
