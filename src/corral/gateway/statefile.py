"""The state directory: ``state.json`` (the configuration, services, entrypoints, challenges and the
certificates' expiry) and ``certs/<host>.crt``/``.key``, every file written atomically (a temporary file, fsync,
rename) and readable by its owner only; and the TLS contexts made from the certificates."""

from __future__ import annotations

import json
import os
import ssl
import tempfile

from .core import der
from .core.model import BadRequest, State, from_json, to_json

STATE_FILE = "state.json"
CERTS = "certs"


def _write_atomic(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def prepare(state_dir: str) -> None:
    os.makedirs(os.path.join(state_dir, CERTS), mode=0o700, exist_ok=True)


def load(state_dir: str) -> State:
    """The stored state (empty when there is none); ``ValueError`` says what is wrong with a damaged file."""
    path = os.path.join(state_dir, STATE_FILE)
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return State()
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    try:
        return from_json(data)
    except BadRequest as e:
        raise ValueError(f"{path} is damaged: {e}") from None


def save(state_dir: str, state: State) -> None:
    _write_atomic(os.path.join(state_dir, STATE_FILE), json.dumps(to_json(state), indent=1).encode())


def _cert_paths(state_dir: str, host: str) -> tuple[str, str]:
    base = os.path.join(state_dir, CERTS, host)
    return base + ".crt", base + ".key"


def server_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    ctx.load_cert_chain(certfile, keyfile)
    return ctx


def store_certificate(state_dir: str, host: str, fullchain_pem: str, key_pem: str) -> tuple[str, ssl.SSLContext]:
    """Check a certificate (it parses, its key matches), store it for ``host``; returns its notAfter (ISO 8601)
    and the TLS context serving it. :class:`BadRequest` names the field at fault."""
    try:
        certs = der.pem_blocks(fullchain_pem, "CERTIFICATE")
        if not certs:
            raise BadRequest("certificate.fullchain_pem holds no -----BEGIN CERTIFICATE----- block")
        expiry = der.not_after(certs[0]).strftime("%Y-%m-%dT%H:%M:%SZ")
    except der.CertificateError as e:
        raise BadRequest(f"certificate.fullchain_pem is not a valid certificate: {e}") from None
    if "PRIVATE KEY-----" not in key_pem:
        raise BadRequest("certificate.key_pem holds no -----BEGIN ... PRIVATE KEY----- block")
    certfile, keyfile = _cert_paths(state_dir, host)
    staged = {p: p + ".new" for p in (certfile, keyfile)}
    _write_atomic(staged[certfile], fullchain_pem.encode())
    _write_atomic(staged[keyfile], key_pem.encode())
    try:
        ctx = server_context(staged[certfile], staged[keyfile])
    except (ssl.SSLError, ValueError) as e:
        for p in staged.values():
            os.unlink(p)
        raise BadRequest(f"certificate.key_pem does not match certificate.fullchain_pem, or one is unreadable: {e}")
    for final, tmp in staged.items():
        os.replace(tmp, final)
    return expiry, ctx


def load_contexts(state_dir: str, state: State) -> tuple[dict[str, ssl.SSLContext], list[str]]:
    """The TLS context of every stored certificate, and what is wrong with those that no longer load."""
    out: dict[str, ssl.SSLContext] = {}
    problems: list[str] = []
    for host in state.certificates:
        try:
            out[host] = server_context(*_cert_paths(state_dir, host))
        except (OSError, ssl.SSLError) as e:
            problems.append(f"the stored certificate of {host} does not load: {e}")
    return out, problems
