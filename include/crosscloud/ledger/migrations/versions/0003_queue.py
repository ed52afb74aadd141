"""The queue: every run waits in one table for a scheduling pass's decision, which survives any restart.

``queue_entries`` holds each submitted run's request, priority, deadline and
the last decision; ``scheduler_state`` when the last pass ran. Reservations
made before the queue keep working: they simply have no entry.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import sqlite

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

EPOCH = sa.Double().with_variant(sqlite.REAL(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "queue_entries",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
        sa.Column("submitted_at", EPOCH, nullable=False),
        sa.Column("deadline", EPOCH),
        sa.Column("deferrable", sa.Integer, nullable=False, server_default="0"),
        sa.Column("objective", sa.Text, nullable=False, server_default="cost"),
        sa.Column("request", sa.Text, nullable=False),
        sa.Column("runtime_s", EPOCH, nullable=False, server_default="0"),
        sa.Column("holder", sa.Text, nullable=False, server_default=""),
        sa.Column("seen_at", EPOCH, nullable=False),
        sa.Column("decision", sa.Text),
        sa.Column("decided_at", EPOCH),
        sa.Column("started_at", EPOCH),
        sa.Column("ended_at", EPOCH),
        sa.Column("end_reason", sa.Text),
        sa.UniqueConstraint("tenant", "run_id", name="queue_entries_run"),
    )
    op.create_index("queue_entries_state", "queue_entries", ["state"])
    op.create_table(
        "scheduler_state",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
        sa.Column("passed_version", sa.Integer, nullable=False, server_default="-1"),
        sa.Column("passed_at", EPOCH),
    )


def downgrade() -> None:
    op.drop_table("scheduler_state")
    op.drop_index("queue_entries_state", "queue_entries")
    op.drop_table("queue_entries")
