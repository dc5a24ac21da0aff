"""The only package that talks SQL: tables, Alembic migrations, repositories returning domain
objects, leases, and ``plan_apply`` -- the single writer of capacity (job->instance assignments and
instance reservations).

May import: corral.domain, corral.scheduler (data types), sqlalchemy, alembic.
"""
