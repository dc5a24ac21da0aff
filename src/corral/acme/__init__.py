"""ACME (RFC 8555) for gateways' certificates: an async client for the HTTP-01 flow, run in the server.

Owns: account keys (ES256 or RS256; generated when none is given, the PEM handed back to the caller to seal),
the JSON Web Signatures of every request (RFC 7515, with RFC 8555 §6.2's protected header), External Account
Binding (RFC 8555 §7.3.4), the order, its authorizations and their HTTP-01 challenges, the CSR (a fresh ECDSA
P-256 key per certificate), finalization and the chain's download; and the translation of every ACME problem
document (RFC 8555 §6.7) into an :class:`AcmeError` whose message a user can act on.

May import: of corral only ``settings`` (the Let's Encrypt directory constant; the caller reads ``Settings`` and
passes the directory URL, the CA bundle and the EAB credentials in); httpx and cryptography.

Why not certbot's ``acme`` library: it would pull pyOpenSSL and josepy into the server (two more packages to
lock and patch, one of them a deprecated binding), its API is synchronous (the server would run each issuance
on a thread) and it covers every ACME flow while corral needs exactly one: HTTP-01 for one name at a time,
pushed to a gateway by a callback. The flow is a few hundred lines over httpx and cryptography, which the
server already locks, and every error it can meet is mapped here to a message naming the host or the setting
to fix.
"""

from corral.acme.client import AcmeClient, EabCredentials, Issued, Publish, Withdraw
from corral.acme.errors import AcmeError

__all__ = ["AcmeClient", "AcmeError", "EabCredentials", "Issued", "Publish", "Withdraw"]
