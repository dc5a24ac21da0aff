"""The sweep's command input and its answer read (pure); the sweep itself runs against the real cluster in
``test_slurm_compute`` and ``test_slurm_runs``."""

from __future__ import annotations

from corral.backends.slurm import sweep


def test_only_job_ids_are_kept_once_each_and_an_empty_input_is_one_line() -> None:
    assert sweep.keep_input(["12", "", "7", "12", "a;rm"]) == "12\n7\n"
    assert sweep.keep_input([]) == "\n"


def test_what_the_command_said() -> None:
    assert sweep.parse(0, "12.out\n12\n\n", "") == sweep.Swept(("12.out", "12"))
    assert sweep.parse(0, "", "") == sweep.Swept(())
    failed = sweep.parse(sweep.NO_SQUEUE, "", "squeue: error: Unable to contact slurm controller\n")
    assert failed.removed == () and failed.error == "squeue failed: squeue: error: Unable to contact slurm controller"
    assert sweep.parse(1, "", "no\nspace").error == "exit status 1: no space"


def test_the_grace_is_in_minutes_never_below_zero() -> None:
    assert "-mmin +1.0000 " in sweep.command(60) and "-mmin +0.0000 " in sweep.command(-5)
