"""The first ledger: reservations, pins and cloud membership (the schema of the SQLite-only ledger).

A database the SQLite-only code made has these tables and no version table;
``migrate.upgrade`` stamps it at this revision, so its rows are kept.

Revision ID: 0001
Revises:
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import sqlite

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

EPOCH = sa.Double().with_variant(sqlite.REAL(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "reservations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("cloud", sa.Text, nullable=False),
        sa.Column("accelerator", sa.Text, nullable=False),
        sa.Column("devices", sa.Integer, sa.CheckConstraint("devices > 0"), nullable=False),
        sa.Column("created_at", EPOCH, nullable=False),
        sa.Column("released_at", EPOCH),
    )
    op.create_index("reservations_active", "reservations", ["released_at", "tenant", "run_id"])
    op.create_table(
        "pins",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("artifact", sa.Text, nullable=False),
        sa.Column("cloud", sa.Text, nullable=False),
        sa.Column("expires_at", EPOCH, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "artifact", "cloud"),
    )
    op.create_table(
        "clouds",
        sa.Column("cloud", sa.Text, primary_key=True),
        sa.Column("state", sa.Text),
        sa.Column("check_ok", sa.Integer),
        sa.Column("checked_at", EPOCH),
        sa.Column("detail", sa.Text, nullable=False, server_default=""),
    )


def downgrade() -> None:
    op.drop_table("clouds")
    op.drop_table("pins")
    op.drop_index("reservations_active", "reservations")
    op.drop_table("reservations")
