"""A ``type: aws`` block whose credentials do not work stops the server at start-up with a message naming
the project and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.config.server_config import ServerConfigError
from corral.server import prepare
from server_harness import free_port, make_settings


async def test_credentials_that_do_not_work_stop_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    settings = make_settings(tmp_path)
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text(
        "projects:\n  - name: team\n    backends:\n      - type: aws\n"
        "        creds: {type: access_key, access_key: AKIA0, secret_key: s}\n"
    )
    with pytest.raises(ServerConfigError, match=r"project team: backend aws: Invalid credentials \(creds\)"):
        await prepare(settings)
