"""Tune candidates record the sweet-spot rule's verdict on their items (fidelity included), not
only the pooled accuracy interval.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tune_candidates") as batch:
        batch.add_column(sa.Column("acceptable", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("mean_kl", sa.Double(), nullable=True))
        batch.add_column(sa.Column("kl_high", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tune_candidates") as batch:
        for column in ("kl_high", "mean_kl", "acceptable"):
            batch.drop_column(column)
