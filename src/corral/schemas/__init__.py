"""Wire models of the REST API with dstack's field names (requests and responses).

May import: corral.domain, pydantic.
"""
