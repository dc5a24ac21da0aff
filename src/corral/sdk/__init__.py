"""A small synchronous client of corral's (and dstack's) REST API.

May import: corral.schemas, httpx.
"""
