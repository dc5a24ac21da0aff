"""Use cases behind the API: apply a run or fleet plan, stop, delete, logs, users, projects.

May import: corral.domain, corral.config, corral.schemas, corral.scheduler, corral.store,
corral.backends, corral.context, corral.settings, corral.diskspace, corral.policies (the apply policies, asked
by ``apply_policies``). No SQL: statements are the store's functions.

Known exception (listed in pyproject.toml's contract): ``plan_verdict.py`` builds the scheduler's snapshot
with the scheduling worker's own builders (``workers.snapshot_builder``, ``workers.queued_jobs``).
"""
