"""``python`` and ``nvcc`` of a run without an ``image``: what dstack 0.22.5's job configurator does with
them, for the places corral runs such a job.

dstack runs a job without ``image`` in its base image, where ``python: 3.12`` becomes a virtualenv of that
Python made by ``uv`` and activated before the commands (``_dstack_image_commands``), and ``nvcc: true``
picks the image's ``devel`` variant (with the CUDA compiler). corral runs such a job in the server's
default image when it has one (the same commands; the ``devel`` variant of a dstack base image), else as
a process on the host, where the same commands make the virtualenv with the host's ``uv`` -- or with its
``python3 -m venv`` when that is the version asked -- and a job that cannot have what it asked for fails
at once saying so (never a silent other Python, never a missing ``nvcc``).

Pure: builds command lines; imports nothing of corral.
"""

from __future__ import annotations

import shlex
from typing import Any

#: Where the virtualenv goes: dstack's ``/dstack/venv`` in a container; on a host, the job's own temp dir.
VENV_DIR = "${DSTACK_VENV_DIR:-${TMPDIR:-/tmp}/dstack-venv-$DSTACK_JOB_ID}"


def _fail(message: str) -> str:
    return f"{{ echo {shlex.quote('corral: ' + message)} >&2; exit 1; }}"


def prelude(c: dict[str, Any], python: str | None) -> list[str]:
    """The commands that run before a job's own when it has no ``image`` and no ``entrypoint`` (and
    ``docker`` is not set): the virtualenv of ``python`` (None: nothing to make) and the ``nvcc`` check."""
    if c.get("image") is not None or c.get("entrypoint") is not None or c.get("docker") is True:
        return []
    out: list[str] = []
    if c.get("nvcc"):
        out.append(
            "command -v nvcc >/dev/null 2>&1 || "
            + _fail("`nvcc: true` asks for the CUDA compiler, and nvcc is not on this host's PATH")
        )
    if python is None:
        return out
    major, minor = (int(p) for p in python.split(".")[:2])
    wrong = _fail(
        f"`python: {python}` asks for Python {python}: this host has no uv to install it, and its python3 "
        f"is another version; install uv or Python {python} on the host, or set `image`"
    )
    check = f"python3 -c 'import sys; sys.exit(sys.version_info[:2] != ({major}, {minor}))' 2>/dev/null"
    out += [
        f'export DSTACK_VENV_DIR="{VENV_DIR}"',
        'rm -rf "$DSTACK_VENV_DIR"',
        f"if command -v uv >/dev/null 2>&1; then "
        f"(if UV_PYTHON_INSTALL_DIR=/opt/uv/python uv python find {python} > /dev/null 2>&1; "
        f"then export UV_PYTHON_INSTALL_DIR=/opt/uv/python UV_PYTHON_DOWNLOADS=never; fi; "
        f'uv venv -q --prompt dstack -p {python} --seed "$DSTACK_VENV_DIR"); '
        f'elif {check}; then python3 -m venv --prompt dstack "$DSTACK_VENV_DIR"; '
        f"else {wrong}; fi",
        '. "$DSTACK_VENV_DIR/bin/activate"',
    ]
    return out


def image_name(c: dict[str, Any], default_image: str | None, base_image: str) -> str:
    """The job spec's ``image_name``: the configuration's ``image``, else the server's default image (or
    dstack's base image), in its ``devel`` variant for ``nvcc: true`` when it is a dstack base image."""
    name = c.get("image") or default_image or base_image
    if not c.get("image") and c.get("nvcc") and "-base-" in name:
        return name.replace("-base-", "-devel-")
    return str(name)
