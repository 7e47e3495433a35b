"""Telemetry: resource readings of the workers while trials run.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "telemetry",
        # BIGINT on PostgreSQL (a long sweep samples a lot); SQLite's rowid is 64-bit already.
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=True),
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("ts", sa.Double(), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("rss_bytes", sa.BigInteger(), nullable=True),
        sa.Column("cpu_percent", sa.Double(), nullable=True),
        sa.Column("kv_bytes", sa.BigInteger(), nullable=True),
        sa.Column("gpu_memory_used_bytes", sa.BigInteger(), nullable=True),
        sa.Column("gpu_memory_total_bytes", sa.BigInteger(), nullable=True),
        sa.Column("gpu_utilization", sa.Double(), nullable=True),
        sa.Column("gpu_power_w", sa.Double(), nullable=True),
        sa.Column("gpu_temperature_c", sa.Double(), nullable=True),
        sa.Column("process_gpu_memory_bytes", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE",
                                name=op.f("fk_telemetry_experiment_id_experiments")),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"], ondelete="CASCADE",
                                name=op.f("fk_telemetry_trial_id_trials")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_telemetry")),
    )
    op.create_index(op.f("ix_telemetry_experiment_id_ts"), "telemetry", ["experiment_id", "ts"])
    op.create_index(op.f("ix_telemetry_trial_id_ts"), "telemetry", ["trial_id", "ts"])


def downgrade() -> None:
    op.drop_table("telemetry")
