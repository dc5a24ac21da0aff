"""Pure placement: ``schedule(snapshot, queue, now) -> Plan``. Filters and scorers, no I/O.

May import: corral.domain.
"""
