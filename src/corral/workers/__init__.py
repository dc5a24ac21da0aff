"""Reconcilers that drive state forward: schedule -> provision -> drive jobs -> reap.
Each one loads, decides (pure), acts (no transaction open) and applies (short transaction). The jobs worker is
the subpackage :mod:`corral.workers.jobs` (its pass, submission, follower, leases and outcomes).

May import: corral.domain, corral.scheduler, corral.store, corral.backends, corral.context, corral.settings,
corral.diskspace, and the agent's wire protocol (corral.agent.protocol*); the gateways' operation
(``gateway_ops.py``) also the gateway's zipapp builder (corral.gateway.zipapp), and its certificates
(``gateway_certs.py``) the ACME client (corral.acme), on first use. No SQL: statements are the store's functions.

Known exceptions (listed in pyproject.toml's contract): ``queued_jobs.py`` derives a job's scheduling facts
from its run's typed spec where it was stored without them (``config.job_facts``, ``config.run_spec``), and
``snapshot_builder.py`` reads a fleet's typed configuration (corral.config),
``jobs/outcomes.py`` names an instance type as the REST API does (corral.schemas.wire), and ``runtime.py``
warms up the configuration and request models.
"""
