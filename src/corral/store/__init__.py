"""The only package that talks SQL: tables, Alembic migrations, repositories returning domain
objects, leases, and ``plan_apply`` -- the single writer of capacity (job->instance assignments and
instance reservations).

May import: corral.domain, corral.scheduler (its value types and pure rules, which ``plan_apply`` recounts
with), corral.settings (``encryption.py``: where the key comes from), sqlalchemy, alembic. No other package
of corral imports sqlalchemy or alembic: callers name a connection ``db.Connection`` and catch
``errors.Conflict``.
"""
