"""A run's registry credentials at rest: the ``registry_auth`` password of a run configuration is
written sealed with the server key (:mod:`corral.store.encryption`) in the stored run spec
(``configuration.registry_auth.password``) and in each job spec (``registry_auth.password``), and opened
again for the API's answers (dstack returns it as it was given) and for the agent that pulls the image.

Specs are kept as stored JSON and embedded as they are in answers; a spec without a sealed value (no
``registry_auth``, or a row from before the password was sealed, read as it is) is passed through
without parsing. Imports: the store's encryption and the domain's records only (the services seal and
open specs for answers; the jobs worker opens the password it hands to the agent).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from corral.domain.documents import LazyJSON
from corral.domain.records import JobRec, RunRec
from corral.store.encryption import SEALED_PREFIX, Cipher, open_sealed, seal

_MARK = SEALED_PREFIX.encode()


def _with_password(auth: Any, change: Callable[[str], str]) -> Any:
    if not isinstance(auth, dict) or not isinstance(auth.get("password"), str):
        return auth
    return {**auth, "password": change(auth["password"])}


def sealed_run_spec(cipher: Cipher, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` as it is stored: its configuration's registry password sealed."""
    conf = spec.get("configuration")
    if not isinstance(conf, dict) or not conf.get("registry_auth"):
        return spec
    auth = _with_password(conf["registry_auth"], lambda p: seal(cipher, p))
    return {**spec, "configuration": {**conf, "registry_auth": auth}}


def sealed_job_spec(cipher: Cipher, spec: dict[str, Any]) -> dict[str, Any]:
    """A job spec as it is stored: its registry password sealed."""
    if not spec.get("registry_auth"):
        return spec
    return {**spec, "registry_auth": _with_password(spec["registry_auth"], lambda p: seal(cipher, p))}


def opened_auth(cipher: Callable[[], Cipher], auth: Any) -> Any:
    """A stored ``registry_auth`` with its password in clear."""
    return _with_password(auth, lambda p: open_sealed(cipher, p))


def _opened(cipher: Callable[[], Cipher], doc: Mapping[str, Any], job: bool) -> Mapping[str, Any]:
    if not isinstance(doc, LazyJSON) or _MARK not in doc.raw:
        return doc
    value = dict(doc)
    if job:
        value["registry_auth"] = opened_auth(cipher, value.get("registry_auth"))
    elif isinstance(value.get("configuration"), dict):
        conf = value["configuration"]
        value["configuration"] = {**conf, "registry_auth": opened_auth(cipher, conf.get("registry_auth"))}
    return LazyJSON(orjson.dumps(value))


def revealed(cipher: Callable[[], Cipher], run: RunRec) -> RunRec:
    """``run`` with its specs' registry passwords in clear, for an answer."""
    jobs = tuple(_revealed_job(cipher, j) for j in run.jobs)
    spec = _opened(cipher, run.run_spec, job=False)
    if spec is run.run_spec and all(a is b for a, b in zip(jobs, run.jobs, strict=True)):
        return run
    return dataclasses.replace(run, run_spec=spec, jobs=jobs)


def _revealed_job(cipher: Callable[[], Cipher], job: JobRec) -> JobRec:
    spec = _opened(cipher, job.job_spec, job=True)
    return job if spec is job.job_spec else dataclasses.replace(job, job_spec=spec)
