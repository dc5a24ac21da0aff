"""Pure placement: ``schedule(snapshot, now, *, reuse) -> Plan`` (``schedule.py``) and the rules it is made
of (offer filters, screening, fair share, quota gates, preemption, holds, fleet upkeep), each a function of a
``Snapshot`` and ``now``; and the value types (``types.py``) that store and backends speak. No I/O, no clocks.

May import: corral.domain.
"""
