"""The ``corral`` command line (Typer + Rich). Imports are lazy so that ``corral --help`` is instant.

May import: corral.sdk, corral.config, corral.schemas.
"""
