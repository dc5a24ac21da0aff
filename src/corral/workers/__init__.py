"""Reconcilers that drive state forward: schedule -> provision -> drive jobs -> reap.
Each one loads, decides (pure), acts (no transaction open) and applies (short transaction). The jobs worker is
the subpackage :mod:`corral.workers.jobs` (its pass, submission, follower, leases and outcomes).

May import: corral.domain, corral.scheduler, corral.store, corral.backends, corral.context, corral.settings.
"""
