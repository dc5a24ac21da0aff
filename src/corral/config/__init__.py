"""The user-facing configuration models: every `.dstack.yml` type (task, service, dev-environment,
fleet, volume, gateway) and profiles, with dstack's grammar. Unknown keys are errors naming their path.

May import: corral.domain, pydantic, yaml.
"""
