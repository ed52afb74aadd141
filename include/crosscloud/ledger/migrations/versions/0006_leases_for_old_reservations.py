"""Reservations made before leases get one: a run that is gone no longer holds its devices forever.

Before 0002 a reservation had no lease (``lease_expires_at`` NULL) and was
held until something released it, so a run that died with its host kept its
devices. Each one still held gets a lease from the upgrade on, of the
deployment's length (``CROSSCLOUD_LEASE_S``): a run still alive renews it as
any run does, a dead one's devices come back once it lapses, with the
reason in the events.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

from crosscloud.ledger.leases import lease_seconds

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text("UPDATE reservations SET lease_expires_at = :expires, "
                       "holder = CASE WHEN holder = '' THEN 'before leases' ELSE holder END "
                       "WHERE released_at IS NULL AND lease_expires_at IS NULL")
               .bindparams(expires=time.time() + lease_seconds()))


def downgrade() -> None:
    """Nothing to undo: a lease given is kept (the schema is unchanged)."""
