"""Compute providers behind a small ``Compute`` protocol (offers, create, terminate, list owned),
and the server-side client of the host agent.

May import: corral.domain, corral.agent.protocol, corral.settings, httpx.
"""
