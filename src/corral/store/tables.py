"""The schema (SQLAlchemy Core). Alembic migrations in ``migrations/`` create exactly this.

Conventions: ids are UUID strings; times are UTC epoch seconds as double precision (cheap to compare
and index on both SQLite and Postgres); documents (specs, provisioning data) are JSON text. Rows that
workers process carry lease columns (``lock_owner``, ``lock_token``, ``lock_expires_at``) so that
several server replicas on Postgres can claim work without a leader.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

metadata = sa.MetaData()

Time = sa.Float(precision=53)


def _live_unique(name: str, *columns: str) -> sa.Index:
    """Unique among the rows not soft-deleted (a partial index; ``deleted = false`` on Postgres, added by
    :func:`add_postgres_options` when a Postgres database is opened: given here, it would make SQLAlchemy
    import its Postgres dialect, ~50 ms, in every SQLite server's start-up just to check the argument)."""
    index = sa.Index(name, *columns, unique=True, sqlite_where=sa.text("deleted = 0"))
    _POSTGRES_WHERE.append((index, "deleted = false"))
    return index


#: The partial indexes and their Postgres predicates (see ``_live_unique``).
_POSTGRES_WHERE: list[tuple[sa.Index, str]] = []

#: A job waiting to be placed, as SQL text: the predicate of the queue's partial index, and the condition
#: the query that reads that index spells the same way (a bound parameter in its place would keep SQLite
#: and Postgres' generic plans from using the index).
QUEUED_SQL = "status = 'submitted' AND instance_id IS NULL"

#: A run that has not finished (terminated, failed, done), as SQL text: the predicate of the active runs' partial
#: indexes, and the condition the queries that read them spell the same way (as ``QUEUED_SQL``): the runs
#: worker, ``dstack ps`` and a project's live runs read the few active runs, not a year of finished ones.
ACTIVE_RUN_SQL = "status NOT IN ('terminated', 'failed', 'done')"
#: ``ACTIVE_RUN_SQL`` naming the runs table, for a query that joins another table with a ``status``.
ACTIVE_RUN_WHERE = f"runs.{ACTIVE_RUN_SQL}"
#: A job a preemption stopped (``store/preemption.py``), as SQL text: its partial index's predicate, so that a
#: scheduling pass with preemption on finds the recent victims among those few, not among every job.
PREEMPTED_SQL = "stop_requested = 'preempted'"
#: A job some server holds a lease on, as SQL text: its partial index's predicate, so that dropping the leases at
#: start-up (SQLite) reads the few leased jobs, not every job.
LEASED_SQL = "lock_owner IS NOT NULL"
#: An instance not deleted and not yet confirmed terminated, as SQL text: the predicate of ``ix_instances_live``,
#: whose rows are what a scheduling pass reads of every instance (``store/fleet_reader.py``).
LIVE_INSTANCE_SQL = "NOT deleted AND status != 'terminated'"
#: A service's run (its replicas' templates stored), as SQL text: the predicate of ``ix_runs_services``, so that the
#: service scaling worker's pass reads the services, not every live run of a backlog of tasks.
SERVICE_RUN_SQL = "service_templates IS NOT NULL"
#: An instance a fleet lists (``fleets/list``): not deleted, not terminated, or an SSH fleet's host that failed (listed
#: with its error until the fleet is applied again), as SQL text: its partial index's predicate, so that a fleet's
#: instances are read without the terminated ones a cloud fleet leaves behind, however many.
COUNTED_INSTANCE_SQL = "NOT deleted AND (status != 'terminated' OR (backend = 'ssh' AND termination_reason = 'error'))"


def _partial(name: str, *columns: str, where: str) -> sa.Index:
    """An index of the rows where ``where`` holds, on SQLite and Postgres."""
    index = sa.Index(name, *columns, sqlite_where=sa.text(where))
    _POSTGRES_WHERE.append((index, where))
    return index


def _live(name: str, *columns: str) -> sa.Index:
    """An index of the rows not soft-deleted (``deleted = false``, the predicate the queries spell): a list of
    the live fleets or instances reads those, not every row the history left deleted."""
    index = sa.Index(name, *columns, sqlite_where=sa.text("deleted = 0"))
    _POSTGRES_WHERE.append((index, "deleted = false"))
    return index


def _unique_where(name: str, *columns: str, where: str, pg_where: str) -> sa.Index:
    """Unique among the rows where ``where`` holds (``pg_where``: its Postgres spelling)."""
    index = sa.Index(name, *columns, unique=True, sqlite_where=sa.text(where))
    _POSTGRES_WHERE.append((index, pg_where))
    return index


def add_postgres_options() -> None:
    """Give the partial indexes their Postgres predicate (idempotent)."""
    for index, where in _POSTGRES_WHERE:
        if index.dialect_options["postgresql"]["where"] is None:
            index.dialect_options["postgresql"]["where"] = sa.text(where)


def _lease_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("lock_owner", sa.String(100), nullable=True),
        sa.Column("lock_token", sa.String(36), nullable=True),
        sa.Column("lock_expires_at", Time, nullable=True),
    ]


users = sa.Table(
    "users",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("name", sa.String(100), nullable=False, unique=True),
    sa.Column("token", sa.String(200), nullable=False),
    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("global_role", sa.String(20), nullable=False),
    sa.Column("email", sa.String(200), nullable=True),
    sa.Column("active", sa.Boolean, nullable=False, default=True),
    sa.Column("deleted", sa.Boolean, nullable=False, default=False),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("ssh_private_key", sa.Text, nullable=True),
    sa.Column("ssh_public_key", sa.Text, nullable=True),
)

projects = sa.Table(
    "projects",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("owner_id", sa.String(36), sa.ForeignKey("users.id"), nullable=False),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("is_public", sa.Boolean, nullable=False, default=False),
    sa.Column("deleted", sa.Boolean, nullable=False, default=False),
    sa.Column("backends", sa.Text, nullable=False, default="[]"),
    sa.Column("ssh_private_key", sa.Text, nullable=True),
    sa.Column("ssh_public_key", sa.Text, nullable=True),
    _live_unique("ux_projects_name_live", "name"),
)

members = sa.Table(
    "members",
    metadata,
    sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), primary_key=True),
    sa.Column("user_id", sa.String(36), sa.ForeignKey("users.id"), primary_key=True),
    sa.Column("project_role", sa.String(20), nullable=False),
    sa.Column("member_num", sa.Integer, nullable=False, default=0),
)

fleets = sa.Table(
    "fleets",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), nullable=False),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("last_processed_at", Time, nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("status_message", sa.Text, nullable=True),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("deleted", sa.Boolean, nullable=False, default=False),
    *_lease_columns(),
    _live_unique("ux_fleets_project_name_live", "project_id", "name"),
    #: The live fleets in ``fleets/list``'s keyset order (its pages read those, not the deleted ones).
    _live("ix_fleets_live_created", "created_at", "id"),
)

instances = sa.Table(
    "instances",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), nullable=False),
    sa.Column("fleet_id", sa.String(36), sa.ForeignKey("fleets.id"), nullable=True),
    sa.Column("name", sa.String(150), nullable=False),
    sa.Column("instance_num", sa.Integer, nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("unreachable", sa.Boolean, nullable=False, default=False),
    sa.Column("backend", sa.String(30), nullable=False),
    sa.Column("region", sa.String(100), nullable=True),
    sa.Column("price", sa.Float, nullable=True),
    sa.Column("offer", sa.Text, nullable=True),
    sa.Column("total_blocks", sa.Integer, nullable=True),
    sa.Column("busy_blocks", sa.Integer, nullable=False, default=0),
    sa.Column("hostname", sa.String(200), nullable=True),
    sa.Column("agent", sa.Text, nullable=True),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("started_at", Time, nullable=True),
    sa.Column("finished_at", Time, nullable=True),
    sa.Column("last_job_finished_at", Time, nullable=True),
    sa.Column("idle_duration", sa.Float, nullable=True),
    sa.Column("termination_reason", sa.String(50), nullable=True),
    sa.Column("termination_reason_message", sa.Text, nullable=True),
    sa.Column("deleted", sa.Boolean, nullable=False, default=False),
    sa.Column("last_processed_at", Time, nullable=False),
    *_lease_columns(),
    #: What the backend says of the live instance (a Slurm allocation's node and time limit, or why it pends).
    sa.Column("status_message", sa.Text, nullable=True),
    #: The gateway held on this instance (an SSH fleet's host): no job is placed on it while it is set
    #: (written by ``plan_apply``'s gateway hold, the one writer of capacity).
    sa.Column("gateway_id", sa.String(36), nullable=True),
    #: Moved by every UPDATE of the row that SQLAlchemy builds (``onupdate``: no writer sets it, none can forget
    #: it): a scheduling pass reads every live instance's version and reads whole only the rows whose moved.
    sa.Column(
        "version",
        sa.Integer,
        nullable=False,
        default=0,
        server_default="0",
        onupdate=sa.literal_column("version + 1"),
    ),
    sa.Index("ix_instances_fleet_status", "fleet_id", "status"),
    sa.Index("ix_instances_status", "status"),
    _partial("ix_instances_live", "id", "fleet_id", "version", "status", "deleted", where=LIVE_INSTANCE_SQL),
    #: A backend's live instances (a scheduling pass counts the local backend's; a reservation recounts its limit).
    _partial("ix_instances_live_backend", "backend", where=LIVE_INSTANCE_SQL),
    #: Every instance in ``instances/list``'s keyset order (dstack lists the deleted ones too; its ``only_active``
    #: reads the idle and busy ones by status), and those a fleet lists by number (``fleets/list``, not the
    #: instances the history left deleted or terminated).
    sa.Index("ix_instances_created", "created_at", "id"),
    _partial("ix_instances_live_fleet", "fleet_id", "instance_num", where=COUNTED_INSTANCE_SQL),
)

#: Network volumes (EBS on aws): what the project asked (``configuration``, dstack's document), what the
#: cloud made or has (``provisioning``: dstack's ``VolumeProvisioningData``), the instance it is attached to
#: (``instance_id``) and how (``attachment``: its device name and the job it serves), and whether its
#: deletion was asked (``to_be_deleted``; the volumes worker deletes it in the cloud, then ``deleted``).
volumes = sa.Table(
    "volumes",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), nullable=False),
    sa.Column("user_id", sa.String(36), sa.ForeignKey("users.id"), nullable=False),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("status_message", sa.Text, nullable=True),
    sa.Column("configuration", sa.Text, nullable=False),
    sa.Column("provisioning", sa.Text, nullable=True),
    sa.Column("instance_id", sa.String(36), sa.ForeignKey("instances.id"), nullable=True),
    sa.Column("attachment", sa.Text, nullable=True),
    sa.Column("to_be_deleted", sa.Boolean, nullable=False, default=False),
    sa.Column("deleted", sa.Boolean, nullable=False, default=False),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("deleted_at", Time, nullable=True),
    sa.Column("last_processed_at", Time, nullable=False),
    *_lease_columns(),
    _live_unique("ux_volumes_project_name_live", "project_id", "name"),
    sa.Index("ix_volumes_status", "status"),
)

#: Gateways (dstack's ``type: gateway``): the configuration as dstack's wire dump, the status, the project's
#: default (at most one per project), the SSH fleet host it is held on (``instance_id``) and its address
#: (``hostname``), its secret hashed (sha256: what the in-server proxy compares) and sealed (the server's own
#: use), and what its operation keeps to reach it again (``connection``, JSON; ``last_seen_at``). A deletion
#: marks it (``to_be_deleted``); the row goes once its host is released.
gateways = sa.Table(
    "gateways",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), nullable=False),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("status_message", sa.Text, nullable=True),
    sa.Column("configuration", sa.Text, nullable=False),
    sa.Column("wildcard_domain", sa.String(300), nullable=True),
    sa.Column("is_default", sa.Boolean, nullable=False, default=False),
    sa.Column("to_be_deleted", sa.Boolean, nullable=False, default=False),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("last_processed_at", Time, nullable=False),
    sa.Column("instance_id", sa.String(36), sa.ForeignKey("instances.id"), nullable=True),
    sa.Column("hostname", sa.String(200), nullable=True),
    sa.Column("secret_hash", sa.String(64), nullable=True),
    sa.Column("secret_sealed", sa.Text, nullable=True),
    sa.Column("connection", sa.Text, nullable=True),
    sa.Column("last_seen_at", Time, nullable=True),
    *_lease_columns(),
    sa.Index("ux_gateways_project_name", "project_id", "name", unique=True),
    _unique_where("ux_gateways_project_default", "project_id", where="is_default = 1", pg_where="is_default = true"),
    sa.Index("ix_gateways_instance", "instance_id"),
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), nullable=False),
    sa.Column("user_id", sa.String(36), sa.ForeignKey("users.id"), nullable=False),
    sa.Column("run_name", sa.String(150), nullable=False),
    sa.Column("submitted_at", Time, nullable=False),
    sa.Column("last_processed_at", Time, nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("status_message", sa.Text, nullable=True),
    sa.Column("termination_reason", sa.String(50), nullable=True),
    sa.Column("run_spec", sa.Text, nullable=False),
    sa.Column("priority", sa.Integer, nullable=False, default=0),
    sa.Column("fleet_id", sa.String(36), sa.ForeignKey("fleets.id"), nullable=True),
    sa.Column("deployment_num", sa.Integer, nullable=False, default=0),
    sa.Column("deleted", sa.Boolean, nullable=False, default=False),
    sa.Column("repo_id", sa.String(200), nullable=True),
    #: ``schedule``: the crons (a JSON list; None: not scheduled), the trigger the run waits for (or last
    #: fired) and the jobs it submits when it fires (sealed job specs, as the jobs table holds them)
    sa.Column("schedule", sa.Text, nullable=True),
    sa.Column("next_triggered_at", Time, nullable=True),
    sa.Column("job_templates", sa.Text, nullable=True),
    #: A service's replica groups as its current deployment submits them (JSON ``{group: {"job_spec",
    #: "deployment_num"}}``, job specs sealed as the jobs table holds them): rollouts and autoscaling.
    sa.Column("service_templates", sa.Text, nullable=True),
    #: ``stop_criteria: master-done``: the run ends done once its master job is (None, false: ``all-done``).
    sa.Column("stop_on_master_done", sa.Boolean, nullable=True),
    *_lease_columns(),
    #: The gateway a service is published on (None: the in-server proxy, or not a service).
    sa.Column("gateway_id", sa.String(36), nullable=True),
    _live_unique("ux_runs_project_name_live", "project_id", "run_name"),
    sa.Index("ix_runs_project_submitted", "project_id", "submitted_at", "id"),
    sa.Index("ix_runs_submitted", "submitted_at", "id"),
    sa.Index("ix_runs_status", "status"),
    sa.Index("ix_runs_next_triggered_at", "next_triggered_at"),
    #: A user's runs, newest first (``runs/list`` by ``username``, the UI's user filter): the keyset walks that
    #: user's runs alone, not every user's newest until it has a page of theirs.
    sa.Index("ix_runs_user_submitted", "user_id", "submitted_at", "id"),
    #: ``GET /metrics``'s run counts by project, user and status: an index-only count.
    sa.Index("ix_runs_project_user_status", "project_id", "user_id", "status"),
    #: The active runs alone, newest last (all of them; a project's): their size is the live workload's.
    _partial("ix_runs_active", "submitted_at", "id", where=ACTIVE_RUN_SQL),
    _partial("ix_runs_project_active", "project_id", "submitted_at", "id", where=ACTIVE_RUN_SQL),
    #: The services alone, by status (``store/service_scaling.live_services``).
    _partial("ix_runs_services", "status", where=SERVICE_RUN_SQL),
)

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("run_id", sa.String(36), sa.ForeignKey("runs.id"), nullable=False),
    sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), nullable=False),
    sa.Column("run_name", sa.String(150), nullable=False),
    sa.Column("job_num", sa.Integer, nullable=False),
    sa.Column("replica_num", sa.Integer, nullable=False, default=0),
    sa.Column("job_name", sa.String(200), nullable=False),
    sa.Column("submission_num", sa.Integer, nullable=False, default=0),
    sa.Column("deployment_num", sa.Integer, nullable=False, default=0),
    sa.Column("submitted_at", Time, nullable=False),
    sa.Column("last_processed_at", Time, nullable=False),
    sa.Column("finished_at", Time, nullable=True),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("status_message", sa.Text, nullable=True),
    sa.Column("termination_reason", sa.String(50), nullable=True),
    sa.Column("termination_reason_message", sa.Text, nullable=True),
    sa.Column("exit_status", sa.Integer, nullable=True),
    sa.Column("job_spec", sa.Text, nullable=False),
    #: Its scheduling facts (``domain.job_facts``: versioned compact JSON), derived once when it is written, so
    #: that a scheduling pass parses no configuration; null: written without them (derived from the specs).
    sa.Column("scheduling_facts", sa.Text, nullable=True),
    sa.Column("priority", sa.Integer, nullable=False, default=0),
    sa.Column("blocks", sa.Integer, nullable=False, default=1),
    sa.Column("wait_deadline", Time, nullable=True),
    #: The time the job keeps its place in the queue by when it is not ``submitted_at``: a preempted job's
    #: new submission waits in its run's original place, with no wait deadline (null: ``submitted_at``).
    sa.Column("queued_at", Time, nullable=True),
    sa.Column("instance_id", sa.String(36), sa.ForeignKey("instances.id"), nullable=True),
    #: The price ($/hour) of its instance when it was placed (0 on local and SSH hosts), and when: its cost
    #: (``domain/costs.py``) is counted from these, so a price change never rewrites history (null: not placed).
    sa.Column("price", sa.Float, nullable=True),
    sa.Column("placed_at", Time, nullable=True),
    sa.Column("job_provisioning_data", sa.Text, nullable=True),
    sa.Column("job_runtime_data", sa.Text, nullable=True),
    sa.Column("stop_requested", sa.String(20), nullable=True),
    sa.Column("disconnected_at", Time, nullable=True),
    sa.Column("log_offset", sa.Integer, nullable=False, default=0),
    #: When the job's SSH endpoint last saw a connection that counts (open 10 s or more), or when it started
    #: running: a dev environment's ``inactivity_duration`` runs from here.
    sa.Column("ssh_seen_at", Time, nullable=True),
    #: A service replica the proxy routes to (its probes pass; None: not a service replica, or not yet).
    sa.Column("ready", sa.Boolean, nullable=True),
    #: Its probes' state (JSON ``[{"success_streak", "failure_streak"}]``, one per probe of its spec).
    sa.Column("probes", sa.Text, nullable=True),
    #: The last time it was seen ready (a service whose replicas stay unready past ``retry.duration`` fails).
    sa.Column("ready_at", Time, nullable=True),
    #: When a service replica left rotation (rollout, scale-down): drained, then stopped ``scaled_down``.
    sa.Column("drain_at", Time, nullable=True),
    *_lease_columns(),
    sa.Index("uq_jobs_submission", "run_id", "replica_num", "job_num", "submission_num", unique=True),
    sa.Index("ix_jobs_status_queue", "status", "priority", "submitted_at"),
    #: The queue alone, and all a scheduling pass reads of a job it has seen (``queue_reader``): the
    #: pass reads this index, never the table's rows, and its size is the queue's, whatever the history.
    _partial("ix_jobs_queued", "id", "priority", "status_message", where=QUEUED_SQL),
    #: A waiting job's place in its project's queue (``runs.queue_position``, on every ``runs/get`` of a queued
    #: run): the waiting jobs ahead of it are counted from this index alone, never the table's rows (SQLite reads
    #: an index alone only where it holds every column the query names, its predicate's too).
    _partial(
        "ix_jobs_queue_ahead", "project_id", "priority", "submitted_at", "id", "status", "instance_id", where=QUEUED_SQL
    ),
    sa.Index("ix_jobs_instance_status", "instance_id", "status"),
    _partial("ix_jobs_preempted", "finished_at", where=PREEMPTED_SQL),
    _partial("ix_jobs_leased", "id", where=LEASED_SQL),
)

#: Every change to the queue, one row each: a job that came into it, left it (placed, stopped, deleted), or whose
#: priority or status message changed while it waited. Written by triggers on ``jobs`` (migration 0050)
#: and read by the scheduling pass from its last mark on (``store/queue_reader.py``): on SQLite by ``seq``, which
#: grows in commit order there; on Postgres by ``txid``, the writing transaction's id (a prune's marker row, with
#: an empty ``job_id``: the id below which it pruned).
queue_changes = sa.Table(
    "queue_changes",
    metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(36), nullable=False),
    sa.Column("txid", sa.BigInteger, nullable=True),
    sa.Index("ix_queue_changes_txid", "txid", "job_id"),
    sqlite_autoincrement=True,
)


logs = sa.Table(
    "logs",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(36), nullable=False),
    sa.Column("timestamp", Time, nullable=False),
    sa.Column("source", sa.SmallInteger, nullable=False),
    sa.Column("message", sa.LargeBinary, nullable=False),
    sa.Index("ix_logs_job_id", "job_id", "id"),
)

#: One row per job per sample from its agent (``store/metrics.py``): the CPU time is cumulative (µs), the GPUs
#: packed as JSON ``[[memory bytes, util %], ...]`` (null: the job has none).
job_metrics_points = sa.Table(
    "job_metrics_points",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(36), nullable=False),
    sa.Column("timestamp_micro", sa.BigInteger, nullable=False),
    sa.Column("cpu_usage_micro", sa.BigInteger, nullable=False),
    sa.Column("memory_usage_bytes", sa.BigInteger, nullable=False),
    sa.Column("memory_working_set_bytes", sa.BigInteger, nullable=False),
    sa.Column("gpus", sa.Text, nullable=True),
    sa.Index("ux_job_metrics_points_job_ts", "job_id", "timestamp_micro", unique=True),
    sa.Index("ix_job_metrics_points_ts", "timestamp_micro"),
)

#: The web UI's login sessions: the session id is kept hashed; a session holds only while its user's token
#: hash is still ``token_hash`` (a refreshed token ends every session of the user).
ui_sessions = sa.Table(
    "ui_sessions",
    metadata,
    sa.Column("id_hash", sa.String(64), primary_key=True),
    sa.Column("user_id", sa.String(36), sa.ForeignKey("users.id"), nullable=False),
    sa.Column("token_hash", sa.String(64), nullable=False),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("expires_at", Time, nullable=False),
    sa.Index("ix_ui_sessions_user", "user_id"),
)

#: Each project's scheduling policy (``corral.config.quotas``: weight, nominal and max quotas,
#: ``preemptible_max_priority``) as JSON; a project without a row has no limits.
project_quotas = sa.Table(
    "project_quotas",
    metadata,
    sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), primary_key=True),
    sa.Column("policy", sa.Text, nullable=False),
    sa.Column("updated_at", Time, nullable=False),
)

#: Requests the in-server proxy of each server replica counted, per service and second (one row per
#: service, server and second: the autoscaler sums them; old seconds are pruned).
service_request_stats = sa.Table(
    "service_request_stats",
    metadata,
    sa.Column("run_id", sa.String(36), primary_key=True),
    sa.Column("server", sa.String(100), primary_key=True),
    sa.Column("second", sa.BigInteger, primary_key=True),
    sa.Column("requests", sa.Integer, nullable=False),
    sa.Index("ix_service_request_stats_second", "second"),
)

#: Which server replicas may have requests in flight to which service replica: a row is written before a
#: server's first request to the replica and removed once the replica left that server's route with
#: nothing in flight. A drained replica with no row left is stopped at once (``workers.service_scaling``).
service_drains = sa.Table(
    "service_drains",
    metadata,
    sa.Column("job_id", sa.String(36), primary_key=True),
    sa.Column("server", sa.String(100), primary_key=True),
    sa.Column("since", Time, nullable=False),
)

repos = sa.Table(
    "repos",
    metadata,
    sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), primary_key=True),
    sa.Column("repo_id", sa.String(200), primary_key=True),
    sa.Column("info", sa.Text, nullable=False),
)

#: Each user's credentials for a remote repo (``{clone_url, private_key, oauth_token}``), encrypted.
repo_creds = sa.Table(
    "repo_creds",
    metadata,
    sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), primary_key=True),
    sa.Column("repo_id", sa.String(200), primary_key=True),
    sa.Column("user_id", sa.String(36), sa.ForeignKey("users.id"), primary_key=True),
    sa.Column("creds", sa.Text, nullable=False),
)

#: Uploaded code (a diff against the remote commit, or a tar archive), content-addressed per project.
codes = sa.Table(
    "codes",
    metadata,
    sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), primary_key=True),
    sa.Column("blob_hash", sa.String(64), primary_key=True),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("blob", sa.LargeBinary, nullable=False),
    sa.Column("created_at", Time, nullable=False),
)

#: Tar archives of the ``files`` a user's runs mount, content-addressed per user.
file_archives = sa.Table(
    "file_archives",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("user_id", sa.String(36), sa.ForeignKey("users.id"), nullable=False),
    sa.Column("blob_hash", sa.String(64), nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("blob", sa.LargeBinary, nullable=False),
    sa.Column("created_at", Time, nullable=False),
    sa.UniqueConstraint("user_id", "blob_hash", name="uq_file_archives_user_hash"),
)

#: Cross-project sharing of fleets (dstack's exports/imports): an export of a project lists fleets and
#: the projects that import them (or every project when global).
exports = sa.Table(
    "exports",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), nullable=False),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("is_global", sa.Boolean, nullable=False, default=False),
    sa.Column("created_at", Time, nullable=False),
    sa.UniqueConstraint("project_id", "name", name="uq_exports_project_name"),
)

export_importers = sa.Table(
    "export_importers",
    metadata,
    sa.Column("id", sa.String(36), nullable=False, unique=True),
    sa.Column("export_id", sa.String(36), sa.ForeignKey("exports.id"), primary_key=True),
    sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), primary_key=True),
)

exported_fleets = sa.Table(
    "exported_fleets",
    metadata,
    sa.Column("export_id", sa.String(36), sa.ForeignKey("exports.id"), primary_key=True),
    sa.Column("fleet_id", sa.String(36), sa.ForeignKey("fleets.id"), primary_key=True),
)

#: Public SSH keys a user adds (dstack's ``users/public_keys/*``): one per (user, fingerprint).
user_public_keys = sa.Table(
    "user_public_keys",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("user_id", sa.String(36), sa.ForeignKey("users.id"), nullable=False),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("type", sa.String(100), nullable=False),
    sa.Column("fingerprint", sa.String(100), nullable=False),
    sa.Column("key", sa.Text, nullable=False),
    sa.UniqueConstraint("user_id", "fingerprint", name="uq_user_public_keys_user_id_fingerprint"),
)

#: Projects' secrets (dstack's ``secrets/*``): one per (project, name); ``value`` sealed with the server key.
secrets = sa.Table(
    "secrets",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id"), nullable=False),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("updated_at", Time, nullable=False),
    sa.UniqueConstraint("project_id", "name", name="uq_secrets_project_id_name"),
)

#: One-time facts about this database (``store/server_state.py``), e.g. a start-up pass that has run.
server_state = sa.Table(
    "server_state",
    metadata,
    sa.Column("key", sa.String(100), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("updated_at", Time, nullable=False),
)

#: What happened, who did it and to what (dstack's events): one row per event, written in the transaction of
#: the change it records (``store/events.py``); ``actor_user_id`` is None for the system.
events = sa.Table(
    "events",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("recorded_at", Time, nullable=False),
    sa.Column("actor_user_id", sa.String(36), nullable=True),
    sa.Index("ix_events_recorded_at", "recorded_at", "id"),
)

#: The entities an event is about. ``recorded_at`` is the event's, copied so that every filter (an entity,
#: a project, a run's jobs, a fleet's instances) walks its own index in time order.
event_targets = sa.Table(
    "event_targets",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("event_id", sa.String(36), sa.ForeignKey("events.id"), nullable=False),
    sa.Column("recorded_at", Time, nullable=False),
    sa.Column("entity_type", sa.String(20), nullable=False),
    sa.Column("entity_project_id", sa.String(36), nullable=True),
    sa.Column("entity_id", sa.String(36), nullable=False),
    sa.Column("entity_name", sa.String(200), nullable=False),
    sa.Column("entity_run_id", sa.String(36), nullable=True),
    sa.Column("entity_fleet_id", sa.String(36), nullable=True),
    sa.Index("ix_event_targets_event", "event_id"),
    sa.Index("ix_event_targets_entity", "entity_id", "recorded_at"),
    sa.Index("ix_event_targets_project", "entity_project_id", "recorded_at"),
    sa.Index("ix_event_targets_run", "entity_run_id", "recorded_at"),
    sa.Index("ix_event_targets_fleet", "entity_fleet_id", "recorded_at"),
)

#: How many runs each user of each project has in each status, kept by every write of a run's status in the
#: same transaction (``store/run_counts.py``): ``GET /metrics`` reads these few rows, not the runs.
run_counts = sa.Table(
    "run_counts",
    metadata,
    sa.Column("project_id", sa.String(36), primary_key=True),
    sa.Column("user_id", sa.String(36), primary_key=True),
    sa.Column("status", sa.String(20), primary_key=True),
    sa.Column("count", sa.Integer, nullable=False),
)

#: How many times the runs of each project and configuration type were retried whole (dstack: went back to
#: ``pending``), kept with the retry's own transaction (``store/run_counts.py``).
run_pending_counts = sa.Table(
    "run_pending_counts",
    metadata,
    sa.Column("project_id", sa.String(36), primary_key=True),
    sa.Column("run_type", sa.String(20), primary_key=True),
    sa.Column("count", sa.Integer, nullable=False),
)

#: ACME accounts (the gateways' certificates), one per directory URL: the account key sealed with the server's
#: key (``store/gateway_ops.py``), and when the ACME server was last found to have lost the account (a reset:
#: every certificate issued before it is issued again).
acme_accounts = sa.Table(
    "acme_accounts",
    metadata,
    sa.Column("directory_url", sa.String(500), primary_key=True),
    sa.Column("key_sealed", sa.Text, nullable=False),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("reset_at", Time, nullable=True),
)

#: Each gateway's certificates as the server got them (validity, and when their issuance began), and the last
#: failure to get one (when and why: what the renewal rule waits on and what a user reads), per host.
gateway_certificates = sa.Table(
    "gateway_certificates",
    metadata,
    sa.Column("gateway_id", sa.String(36), primary_key=True),
    sa.Column("host", sa.String(300), primary_key=True),
    sa.Column("not_before", Time, nullable=True),
    sa.Column("not_after", Time, nullable=True),
    sa.Column("failed_at", Time, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("issued_at", Time, nullable=True),
)
