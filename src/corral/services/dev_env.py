"""What a dev environment's job runs, as dstack 0.22.5 builds it (``jobs/configurators/dev.py``,
``ides/*.py``): the IDE's server when ``version`` is set, ``init``, then dstack's connect lines (the IDE's
``vscode://``-style link and ``ssh <run>``), then it idles until stopped.

The IDE's server is downloaded from ``base_url`` (the server setting ``ide_download_url``; None: each
vendor's own address), under the vendor's own path, so a mirror or a test's loopback server can stand in;
a failed download fails the job saying so. Pure: no I/O.
"""

from __future__ import annotations

import shlex
from typing import Any

from corral.services.serialize import IDES

VENDOR_BASES = {
    "vscode": "https://update.code.visualstudio.com",
    "cursor": "https://cursor.blob.core.windows.net/remote-releases",
    "windsurf": "https://windsurf-stable.codeiumdata.com",
}
EXTENSIONS = ("ms-python.python", "ms-toolsai.jupyter")
INSTALL_IPYKERNEL = (
    "(echo 'uv pip install ipykernel...' && uv pip install -q --no-cache-dir ipykernel 2> /dev/null) || "
    "(echo 'pip install ipykernel...' && pip install -q --no-cache-dir ipykernel 2> /dev/null) || "
    "echo 'no uv or pip found, ipykernel was not installed'"
)


def _download(ide: str, version: str, base: str) -> tuple[str, str]:
    """The archive's URL and the directory it is unpacked into."""
    base = base.rstrip("/")
    if ide == "vscode":
        return f"{base}/commit:{version}/server-linux-$arch/stable", f'~/.vscode-server/bin/"{version}"'
    if ide == "cursor":
        return (
            f"{base}/{version}/vscode-reh-linux-$arch.tar.gz",
            f'~/.cursor-server/cli/servers/"Stable-{version}"/server',
        )
    number, _, commit = version.partition("@")
    url = f"{base}/linux-reh-$arch/stable/{commit}/windsurf-reh-linux-$arch-{number}.tar.gz"
    return url, f'~/.windsurf-server/bin/"{commit}"'


def install_commands(ide: str | None, version: str | None, base_url: str | None) -> list[str]:
    if ide is None or version is None or ide not in VENDOR_BASES:
        return []  # no version: nothing to download (zed installs its server itself on first connect)
    url, target = _download(ide, version, base_url or VENDOR_BASES[ide])
    archive = f"/tmp/{ide}-server-linux-$arch.tar.gz"
    failed = shlex.quote(
        f"corral: the {IDES[ide][0]} server download failed ({url.replace('$arch', 'ARCH')}): no network? "
        "The server setting CORRAL_IDE_DOWNLOAD_URL points at a mirror; or remove `version`"
    )
    fetch = f'(curl -fsSL "{url}" -o "{archive}" || wget -q "{url}" -O "{archive}")'
    commands = [
        'if [ $(uname -m) = "aarch64" ]; then arch="arm64"; else arch="x64"; fi',
        "mkdir -p /tmp",
        f"{{ {fetch} || {{ echo {failed} >&2; exit 1; }}; }}",
        f"mkdir -p {target}",
        f'tar --no-same-owner -xz --strip-components=1 -C {target} -f "{archive}"',
        f'rm "{archive}"',
    ]
    if ide == "vscode":
        exts = " ".join(f'--install-extension "{e}"' for e in EXTENSIONS)
        commands.append(f'(PATH="$PATH":{target}/bin code-server {exts} || true)')
    return commands


def readme_commands(ide: str | None, run_name: str) -> list[str]:
    lines = []
    if ide in IDES:
        name, scheme = IDES[ide]
        url = (
            f"zed://ssh/{run_name}$DSTACK_WORKING_DIR"
            if ide == "zed"
            else f"{scheme}://vscode-remote/ssh-remote+{run_name}$DSTACK_WORKING_DIR"
        )
        lines += [f"echo 'To open in {name}, use link below:'", "echo", f'echo "  {url}"', "echo"]
    return [*lines, f"echo 'To connect via SSH, use: `ssh {run_name}`'", "echo", "echo -n 'To exit, press Ctrl+C.'"]


def commands(conf: dict[str, Any], run_name: str, base_url: str | None) -> list[str]:
    """The job's commands (joined with ``&&`` by the agent, as dstack's runner does)."""
    ide, version = conf.get("ide"), conf.get("version")
    return [
        *install_commands(ide, version, base_url),
        INSTALL_IPYKERNEL,
        *(conf.get("setup") or []),
        "echo",
        *(conf.get("init") or []),
        *readme_commands(ide, run_name),
        "tail -f /dev/null",
    ]
