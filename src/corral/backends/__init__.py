"""Compute providers behind a small ``Compute`` protocol (offers, create, terminate, list owned),
and the server-side client of the host agent.

May import: corral.domain, corral.agent.protocol, corral.settings (the agent client speaks HTTP/1.1 itself:
``agent_http``).
"""
