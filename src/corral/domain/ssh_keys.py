"""Where an SSH fleet keeps private keys: the places in a fleet spec and in a host's connection document.

A fleet spec carries ``ssh_key: {public, private}`` objects (the CLI resolves ``identity_file`` into
them) at four places: ``ssh_config``, ``ssh_config.proxy_jump``, each host object, and each host
object's ``proxy_jump``. A host's connection document (``backends/ssh.py``; stored in the instance's
``agent`` JSON) carries ``private_key`` and ``proxy_jump.private_key``.

These functions walk those places without knowing what is done to a key: sealing it for the database,
opening it for a connection, dropping it for a client, or keeping only its public half for a comparison.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any


def _key_holders(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every object of ``spec`` that may hold an ``ssh_key`` (each at most once)."""
    ssh = (spec.get("configuration") or {}).get("ssh_config")
    if not isinstance(ssh, dict):
        return
    yield ssh
    if isinstance(ssh.get("proxy_jump"), dict):
        yield ssh["proxy_jump"]
    for host in ssh.get("hosts") or []:
        if isinstance(host, dict):
            yield host
            if isinstance(host.get("proxy_jump"), dict):
                yield host["proxy_jump"]


def spec_private_keys(spec: dict[str, Any]) -> list[str]:
    """The private keys a fleet spec holds, as stored there."""
    out = []
    for holder in _key_holders(spec):
        key = holder.get("ssh_key")
        if isinstance(key, dict) and isinstance(key.get("private"), str):
            out.append(key["private"])
    return out


def map_spec_keys(spec: dict[str, Any], fn: Callable[[str], str]) -> dict[str, Any]:
    """A copy of ``spec`` with each private key ``k`` replaced by ``fn(k)`` (``spec`` itself when it
    holds none: a cloud fleet)."""
    if not spec_private_keys(spec):
        return spec
    out = copy.deepcopy(spec)
    for holder in _key_holders(out):
        key = holder.get("ssh_key")
        if isinstance(key, dict) and isinstance(key.get("private"), str):
            holder["ssh_key"] = {**key, "private": fn(key["private"])}
    return out


def without_keys(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with every ``ssh_key`` set to None (what clients see)."""
    if (spec.get("configuration") or {}).get("ssh_config") is None:
        return spec
    out = copy.deepcopy(spec)
    for holder in _key_holders(out):
        if "ssh_key" in holder:
            holder["ssh_key"] = None
    return out


def public_halves(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with each ``ssh_key`` reduced to its public half: two specs compare equal this way when
    they name the same key pairs, whether their private halves are sealed or not."""
    if (spec.get("configuration") or {}).get("ssh_config") is None:
        return spec
    out = copy.deepcopy(spec)
    for holder in _key_holders(out):
        key = holder.get("ssh_key")
        if isinstance(key, dict):
            holder["ssh_key"] = {"public": key.get("public")}
    return out


def map_connection_keys(connection: dict[str, Any], fn: Callable[[str], str]) -> dict[str, Any]:
    """A copy of a host's connection document with its private keys (the host's and its proxy jump's)
    replaced by ``fn(key)``."""
    out = dict(connection)
    if isinstance(out.get("private_key"), str):
        out["private_key"] = fn(out["private_key"])
    proxy = out.get("proxy_jump")
    if isinstance(proxy, dict) and isinstance(proxy.get("private_key"), str):
        out["proxy_jump"] = {**proxy, "private_key": fn(proxy["private_key"])}
    return out


def connection_private_keys(connection: dict[str, Any]) -> list[str]:
    """The private keys a host's connection document holds, as stored there."""
    proxy = connection.get("proxy_jump")
    keys = (connection.get("private_key"), proxy.get("private_key") if isinstance(proxy, dict) else None)
    return [k for k in keys if isinstance(k, str)]
