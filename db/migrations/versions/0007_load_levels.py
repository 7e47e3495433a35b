"""A ``[load]`` table's measurements: each config's server at each load level.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "load_levels",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("config_name", sa.Text(), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("level", sa.Double(), nullable=False),
        sa.Column("result", JSON, nullable=False),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"], ondelete="CASCADE",
                                name=op.f("fk_load_levels_trial_id_trials")),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE",
                                name=op.f("fk_load_levels_experiment_id_experiments")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_load_levels")),
        sa.UniqueConstraint("trial_id", "mode", "level", name=op.f("uq_load_levels_trial_id_mode_level")),
    )
    op.create_index(op.f("ix_load_levels_experiment_id"), "load_levels", ["experiment_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_load_levels_experiment_id"), table_name="load_levels")
    op.drop_table("load_levels")
