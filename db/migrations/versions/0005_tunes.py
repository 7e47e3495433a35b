"""``kvlab tune``: trials may run only their first N items, and tunes record their study, driver
and verdicts.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TUNE_STATE_CHECK = "state IN ('running', 'done', 'cancelled', 'failed')"
CANDIDATE_STATE_CHECK = "state IN ('active', 'stopped', 'complete')"


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("item_limit", sa.Integer(), nullable=True))
    op.create_table(
        "tunes",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("study_name", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("driver_id", sa.Text(), nullable=True),
        sa.Column("driver_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("grid_points", sa.Integer(), nullable=False),
        sa.Column("grid_item_evals", sa.Integer(), nullable=False),
        sa.Column("recommendation", JSON, nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(TUNE_STATE_CHECK, name=op.f("ck_tunes_state")),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE",
                                name=op.f("fk_tunes_experiment_id_experiments")),
        sa.PrimaryKeyConstraint("experiment_id", name=op.f("pk_tunes")),
    )
    op.create_table(
        "tune_candidates",
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=True),
        sa.Column("rung", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("judged_items", sa.Integer(), nullable=False),
        *(sa.Column(name, sa.Double(), nullable=True) for name in (
            "accuracy", "diff", "diff_low", "diff_high", "kv_bytes", "ttft_ms", "tpot_ms", "judged_at")),
        sa.CheckConstraint(CANDIDATE_STATE_CHECK, name=op.f("ck_tune_candidates_state")),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"], ondelete="CASCADE",
                                name=op.f("fk_tune_candidates_trial_id_trials")),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE",
                                name=op.f("fk_tune_candidates_experiment_id_experiments")),
        sa.PrimaryKeyConstraint("trial_id", name=op.f("pk_tune_candidates")),
    )
    op.create_index(op.f("ix_tune_candidates_experiment_id"), "tune_candidates", ["experiment_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_tune_candidates_experiment_id"), table_name="tune_candidates")
    op.drop_table("tune_candidates")
    op.drop_table("tunes")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("item_limit")
