"""Served models' fleets in the ledger: ``inference_placement``, ``demand_response`` and the CLI see one fleet from
any host.

Before, a fleet was files in the state folder of the host that served it, so
two Celery workers saw two fleets. One row per tenant and served model holds
its replicas, the decision and grid cuts in force and where its router runs.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import sqlite

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

EPOCH = sa.Double().with_variant(sqlite.REAL(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "serving_fleets",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("record", sa.Text, nullable=False, server_default="{}"),
        sa.Column("updated_at", EPOCH, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("serving_fleets")
