"""The ledger's tables as the queries see them: the schema at the newest migration.

The migrations (``migrations/versions``) build it and are its history; a test
compares this metadata with a migrated database, so the two cannot drift.
Times are epoch seconds in a double (``REAL`` in SQLite, as the first schema
had them; ``DOUBLE PRECISION`` in PostgreSQL, whose ``REAL`` is too coarse).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

EPOCH = sa.Double().with_variant(sqlite.REAL(), "sqlite")
# the migrations' own table of the revision a database is at; not Alembic's default name, so a ledger may
# share a PostgreSQL database with Airflow's metadata (whose alembic_version holds Airflow's revision)
VERSION_TABLE = "crosscloud_ledger_version"

metadata = sa.MetaData()

reservations = sa.Table(
    "reservations", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("cloud", sa.Text, nullable=False),
    sa.Column("accelerator", sa.Text, nullable=False),
    sa.Column("devices", sa.Integer, sa.CheckConstraint("devices > 0"), nullable=False),
    sa.Column("created_at", EPOCH, nullable=False),
    sa.Column("released_at", EPOCH),
    # revision 0002: a reservation is a lease its run renews
    sa.Column("holder", sa.Text, nullable=False, server_default=""),
    sa.Column("lease_expires_at", EPOCH),  # NULL: held until released (reservations older than leases)
    sa.Column("release_reason", sa.Text),
    sa.Index("reservations_active", "released_at", "tenant", "run_id"),
)

pins = sa.Table(
    "pins", metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("artifact", sa.Text, primary_key=True),
    sa.Column("cloud", sa.Text, primary_key=True),
    sa.Column("expires_at", EPOCH, nullable=False),
)

clouds = sa.Table(
    "clouds", metadata,
    sa.Column("cloud", sa.Text, primary_key=True),
    sa.Column("state", sa.Text),
    sa.Column("check_ok", sa.Integer),
    sa.Column("checked_at", EPOCH),
    sa.Column("detail", sa.Text, nullable=False, server_default=""),
)

events = sa.Table(
    "ledger_events", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("at", EPOCH, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("cloud", sa.Text, nullable=False),
    sa.Column("devices", sa.Integer, nullable=False),
    sa.Column("detail", sa.Text, nullable=False, server_default=""),
    sa.Index("ledger_events_run", "tenant", "run_id"),
)

# revision 0003: the federation's one queue (crosscloud.scheduler); a row per submitted run
queue_entries = sa.Table(
    "queue_entries", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),  # queued, running, paused, done, cancelled, expired, refused
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
    sa.Column("submitted_at", EPOCH, nullable=False),
    sa.Column("deadline", EPOCH),
    sa.Column("deferrable", sa.Integer, nullable=False, server_default="0"),
    sa.Column("objective", sa.Text, nullable=False, server_default="cost"),
    sa.Column("request", sa.Text, nullable=False),  # the job as placement sees it (JSON, crosscloud.scheduler.entry)
    sa.Column("runtime_s", EPOCH, nullable=False, server_default="0"),
    sa.Column("holder", sa.Text, nullable=False, server_default=""),
    sa.Column("seen_at", EPOCH, nullable=False),  # the waiter's last look: an entry nobody waits for expires
    sa.Column("decision", sa.Text),  # the last pass's decision (JSON)
    sa.Column("decided_at", EPOCH),
    sa.Column("started_at", EPOCH),
    sa.Column("ended_at", EPOCH),
    sa.Column("end_reason", sa.Text),
    sa.UniqueConstraint("tenant", "run_id", name="queue_entries_run"),
    sa.Index("queue_entries_state", "state"),
    sa.Index("queue_entries_submitted", "submitted_at"),  # revision 0005: each pass reads the last day's
)

# one row: when the last scheduling pass ran, and the queue's version it saw (bumped by every change)
scheduler_state = sa.Table(
    "scheduler_state", metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("version", sa.Integer, nullable=False, server_default="0"),
    sa.Column("passed_version", sa.Integer, nullable=False, server_default="-1"),
    sa.Column("passed_at", EPOCH),
)

# revision 0004: what each program costs per accelerator type, as its last run measured it
program_figures = sa.Table(
    "program_figures", metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("program", sa.Text, primary_key=True),  # the program's code sha256
    sa.Column("architecture", sa.Text, primary_key=True),  # crosscloud.store.header.fingerprint of its model
    sa.Column("accelerator", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, nullable=False, server_default=""),  # the program as its runs named it
    sa.Column("parameters", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("seconds_per_sample", EPOCH, nullable=False),  # device-seconds per sample on a device of speed 1
    sa.Column("peak_memory_gb", EPOCH, nullable=False, server_default="0"),  # one rank's peak, at ``batch``
    sa.Column("batch", sa.Integer, nullable=False, server_default="0"),  # one rank's samples per step then
    sa.Column("runs", sa.Integer, nullable=False, server_default="1"),
    sa.Column("measured_at", EPOCH, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False, server_default=""),
)

# revision 0007: each served model's fleet (replicas, decision, grid cuts, router), shared by every host
serving_fleets = sa.Table(
    "serving_fleets", metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, primary_key=True),  # the served model's name
    sa.Column("record", sa.Text, nullable=False, server_default="{}"),  # JSON: spec, replicas, decision, cuts, router
    sa.Column("updated_at", EPOCH, nullable=False),
)
