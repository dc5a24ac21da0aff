"""Session-wide fixtures shared by several test directories: a real Docker engine with test images, and
image registries on loopback (see ``docker_harness``). They start only when a test asks for them.
The skip policy (``skip_policy``: only platform conditions may skip) is loaded as a plugin."""

from __future__ import annotations

import os
from collections.abc import Iterator

# An illegal status change raises in every test, in this process and in the servers it starts
# (``store/transitions.py``); set before corral is imported, which reads it once.
os.environ["CORRAL_STRICT_TRANSITIONS"] = "1"
# Servers started from the environment never fetch gpuhunt's public price catalogue (tests stay offline); the
# live catalogue's tests give theirs a file:// one.
os.environ.setdefault("CORRAL_AWS_LIVE_CATALOG", "off")

import pytest

from docker_harness import (
    CMD_IMAGE,
    DEFAULT_IMAGE,
    REGISTRY_USER,
    UBUNTU,
    DockerEngine,
    Registries,
    Registry,
    busybox_rootfs,
)

pytest_plugins = ["skip_policy"]


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerEngine]:
    engine = DockerEngine(tmp_path_factory.mktemp("docker")).start()
    try:
        engine.import_image(UBUNTU, busybox_rootfs())
        engine.import_image(
            CMD_IMAGE, busybox_rootfs(), "WORKDIR /srv", 'CMD ["sh", "-c", "echo from the image in $(pwd)"]'
        )
        engine.import_image(
            DEFAULT_IMAGE,
            busybox_rootfs(
                {
                    "bin/bash": b'#!/bin/sh\nexport SHELL_NAME=bash\nexec /bin/sh "$@"\n',
                    "etc/corral-image": b"default\n",
                },
                executable=("bin/bash",),
            ),
        )
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def registries(docker_engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registries]:
    base = tmp_path_factory.mktemp("registries")
    open_reg = Registry(base / "open").start()
    private = Registry(base / "private", auth=REGISTRY_USER).start()
    try:
        yield Registries(open_reg, private, docker_engine)
    finally:
        open_reg.stop()
        private.stop()
