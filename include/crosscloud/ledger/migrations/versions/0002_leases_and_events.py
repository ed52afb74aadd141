"""Leases and events: a reservation belongs to a live run, and every release is recorded with its reason.

``holder`` says who admitted it, ``lease_expires_at`` when it lapses unless
renewed (NULL for reservations made before leases: held until released) and
``release_reason`` why it ended; ``ledger_events`` keeps each release.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import sqlite

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

EPOCH = sa.Double().with_variant(sqlite.REAL(), "sqlite")


def upgrade() -> None:
    op.add_column("reservations", sa.Column("holder", sa.Text, nullable=False, server_default=""))
    op.add_column("reservations", sa.Column("lease_expires_at", EPOCH))
    op.add_column("reservations", sa.Column("release_reason", sa.Text))
    op.create_table(
        "ledger_events",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("at", EPOCH, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("cloud", sa.Text, nullable=False),
        sa.Column("devices", sa.Integer, nullable=False),
        sa.Column("detail", sa.Text, nullable=False, server_default=""),
    )
    op.create_index("ledger_events_run", "ledger_events", ["tenant", "run_id"])


def downgrade() -> None:
    op.drop_index("ledger_events_run", "ledger_events")
    op.drop_table("ledger_events")
    with op.batch_alter_table("reservations") as batch:  # SQLite drops columns by copying the table
        batch.drop_column("release_reason")
        batch.drop_column("lease_expires_at")
        batch.drop_column("holder")
