"""Whether this host's Docker engine can start a privileged container, which ``privileged: true`` and
``docker: true`` ask for: found once per agent (one a host), by creating and starting one container of the
job's image, privileged, that runs ``true``, and kept. An engine whose root lacks some capability a
privileged container gets (Docker running inside another container, say) cannot: runc refuses to start it
with "unable to apply caps: operation not permitted" (runc's ``libcontainer/capabilities``). An answer that
is not clear (the image has no ``true``, the engine is away) is not kept: the job's own start says.
"""

from __future__ import annotations

import logging
import threading
import uuid

from .docker import Docker, DockerError

log = logging.getLogger("corral.agent")

#: What runc answers when the engine cannot give a container the capabilities it asks for.
CAPS_ERROR = "unable to apply caps"


def refusal_message(engine_error: str) -> str:
    """The job's failure on a host whose engine cannot start privileged containers, and what to change."""
    return (
        "This host cannot run a privileged container, which `docker: true` and `privileged: true` need: its "
        "Docker engine lacks capabilities such a container gets (as when Docker itself runs inside a container; "
        f"the engine said: {engine_error.strip()}); run the job in a fleet whose hosts' Docker has every "
        "capability, or remove `docker` (`privileged`)"
    )


class PrivilegedProbe:
    """The cached answer for this agent's Docker engine (see the module's docstring)."""

    def __init__(self, docker: Docker, labels: dict[str, str]) -> None:
        self.docker = docker
        #: Put on the probe's container, so that a sweep removes one an agent's crash left.
        self.labels = labels
        self._lock = threading.Lock()
        self._known = False
        self._refusal: str | None = None
        #: How many containers the probe started (once, unless the answers were not clear).
        self.probes = 0

    def refusal(self, image: str) -> str | None:
        """Why a privileged container of ``image`` cannot start on this host, or None when it can (or may)."""
        with self._lock:
            if not self._known:
                self._known, self._refusal = self._probe(image)
            return self._refusal

    def _probe(self, image: str) -> tuple[bool, str | None]:
        """(whether the answer is clear, the refusal)."""
        config = {
            "Image": image, "Entrypoint": ["true"], "Cmd": [], "Labels": self.labels, "NetworkDisabled": True,
            "HostConfig": {"Privileged": True, "NetworkMode": "none"},
        }  # fmt: skip
        try:
            cid = self.docker.create(f"corral-privileged-probe-{uuid.uuid4().hex[:12]}", config)
        except DockerError as e:
            log.info("cannot create the privileged probe's container: %s", e.message)
            return False, None
        self.probes += 1
        try:
            self.docker.start(cid)
            return True, None
        except DockerError as e:
            if CAPS_ERROR in e.message:
                log.warning("this host's Docker engine cannot start privileged containers: %s", e.message)
                return True, refusal_message(e.message)
            log.info("the privileged probe's container did not start: %s", e.message)
            return False, None
        finally:
            try:
                self.docker.remove(cid)
            except DockerError as e:
                log.info("removing the privileged probe's container %s: %s", cid[:12], e.message)
