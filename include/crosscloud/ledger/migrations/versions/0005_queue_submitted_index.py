"""Each pass reads the last day's submissions (``QueueStore.submitted_since``): an index on ``submitted_at``.

The queue's rows are kept after their runs end, so without it every pass of a
long-lived deployment would scan them all.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("queue_entries_submitted", "queue_entries", ["submitted_at"])


def downgrade() -> None:
    op.drop_index("queue_entries_submitted", table_name="queue_entries")
