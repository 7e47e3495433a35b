"""KV byte columns may be empty: an OpenAI-compatible endpoint does not say what its cache holds.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

COLUMNS = ("baseline_kv_bytes", "physical_kv_bytes", "analytic_kv_bytes", "peak_kv_bytes")


def upgrade() -> None:
    with op.batch_alter_table("item_results") as batch:  # SQLite rebuilds the table; PostgreSQL alters in place
        for column in COLUMNS:
            batch.alter_column(column, existing_type=sa.BigInteger(), nullable=True)


def downgrade() -> None:
    with op.batch_alter_table("item_results") as batch:
        for column in COLUMNS:
            batch.alter_column(column, existing_type=sa.BigInteger(), nullable=False)
