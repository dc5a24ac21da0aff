"""Use cases behind the API: apply a run or fleet plan, stop, delete, logs, users, projects.

May import: corral.domain, corral.config, corral.schemas, corral.scheduler, corral.store,
corral.backends, corral.context, corral.settings.
"""
