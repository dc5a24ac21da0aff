"""A fake ``nvidia-smi`` that prints the captured output of a real one (``tests/data/nvidia-smi/``, each file's
source in its README) for exactly the command lines corral runs, and fails for any other, so that a query the
agent changes without a capture to match fails its tests rather than meeting a made-up answer.

``install(bin_dir)`` writes ``bin_dir/nvidia-smi``; put ``bin_dir`` first on ``PATH``. The sampling query
answers from the "busy" capture while a process whose command line holds :data:`LOAD_MARKER` runs (the GPU
check's load, or its CPU stand-in), else from the "idle" one.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

H100 = Path(__file__).resolve().parent / "data" / "nvidia-smi" / "h100-80gb-hbm3"
#: A process whose command line holds this makes the GPU "busy" (``scripts/gpu_check.py`` names its load so).
LOAD_MARKER = "gpu-check-load"
HOST_QUERY = ("--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits")
SAMPLE_QUERY = ("--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader,nounits")
ANSWERS = {
    (): "nvidia-smi.txt",
    ("-L",): "list-gpus.txt",
    HOST_QUERY: "query-name-memory-driver.csv",
}


def install(bin_dir: Path, fixtures: Path = H100) -> Path:
    """Write the fake ``nvidia-smi`` into ``bin_dir`` (a shell script: a sandboxed job's uid runs it too);
    returns its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    # the captures are copied beside the fake: a sandboxed job may not see the checkout (its own /tmp hides a
    # checkout under /tmp, as a CI runner's may be)
    captures = bin_dir / "nvidia-smi-captures"
    shutil.rmtree(captures, ignore_errors=True)
    shutil.copytree(fixtures, captures)
    for path in (captures, *captures.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    f = shlex.quote(str(captures))
    # ``loa[d]``: the pattern does not match grep's own command line, which holds it
    busy = f"grep -qs '{LOAD_MARKER[:-1]}[{LOAD_MARKER[-1]}]' /proc/[0-9]*/cmdline"
    cases = "".join(f"  {shlex.quote(' '.join(args))}) exec cat {f}/{name} ;;\n" for args, name in ANSWERS.items())
    fake = bin_dir / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n# a fake nvidia-smi: captured output of a real one (tests/nvidia_smi_fake.py)\n"
        'case "$*" in\n'
        f"{cases}"
        f"  {shlex.quote(' '.join(SAMPLE_QUERY))})\n"
        f"    if {busy}; then exec cat {f}/query-index-memory-util-busy.csv; fi\n"
        f"    exec cat {f}/query-index-memory-util-idle.csv ;;\n"
        "esac\n"
        'echo "fake nvidia-smi: no captured output for: nvidia-smi $*" >&2\nexit 2\n'
    )
    fake.chmod(0o755)
    return fake
