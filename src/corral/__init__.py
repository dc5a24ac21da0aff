"""corral: an orchestrator for AI and GPU workloads that speaks dstack's REST API.

Packages and what they may import (checked by import-linter, see pyproject.toml):
domain (pure, imports nothing) <- everything; scheduler, config, schemas -> domain only;
store -> domain, scheduler, settings, and it alone imports sqlalchemy; api never imports store; sdk -> schemas only;
cli -> sdk, config, schemas; agent and gateway -> the standard library only.
"""

__version__ = "0.1.0"

#: The dstack API level corral implements; reported as ``server_version``.
DSTACK_API_VERSION = "0.22.5"
