"""What each program costs, measured: its parameters, seconds per sample and peak memory per accelerator.

``program_figures`` holds, per tenant, program (its code's sha256), model
architecture and accelerator type, what the last run of it measured; placement
and the queue's estimates read it before they fall back on what the program
declares or on an estimate from its parameter count.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import sqlite

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

EPOCH = sa.Double().with_variant(sqlite.REAL(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "program_figures",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("program", sa.Text, primary_key=True),
        sa.Column("architecture", sa.Text, primary_key=True),
        sa.Column("accelerator", sa.Text, primary_key=True),
        sa.Column("name", sa.Text, nullable=False, server_default=""),
        sa.Column("parameters", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("seconds_per_sample", EPOCH, nullable=False),
        sa.Column("peak_memory_gb", EPOCH, nullable=False, server_default="0"),
        sa.Column("batch", sa.Integer, nullable=False, server_default="0"),
        sa.Column("runs", sa.Integer, nullable=False, server_default="1"),
        sa.Column("measured_at", EPOCH, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False, server_default=""),
    )


def downgrade() -> None:
    op.drop_table("program_figures")
