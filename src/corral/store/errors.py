"""What the store raises that its callers handle, so that no caller outside ``store`` catches a database
driver's or SQLAlchemy's exception.

Imports nothing of corral and no sqlalchemy.
"""

from __future__ import annotations


class Conflict(Exception):
    """A write clashed with a row that another request or server replica wrote first (a unique key was
    taken). The transaction it ran in is over or must end: the caller says the resource exists, or tries
    again in a new transaction."""
