"""Item results record the eviction scorer's and the first step's time apart, and whether their
KV bytes were measured from tensors or estimated (a server's start-up pool line).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("item_results") as batch:
        batch.add_column(sa.Column("score_s", sa.Double(), nullable=True))
        batch.add_column(sa.Column("first_token_s", sa.Double(), nullable=True))
        batch.add_column(sa.Column("kv_bytes_estimated", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("item_results") as batch:
        for column in ("kv_bytes_estimated", "first_token_s", "score_s"):
            batch.drop_column(column)
