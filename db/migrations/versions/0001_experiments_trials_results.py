"""Experiments, their trials (one per KV-cache config), item results and the event log.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
STATUS_CHECK = "status IN ('queued', 'running', 'done', 'failed', 'cancelled')"


def utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("tags", JSON, nullable=False),
        sa.Column("notes", sa.Text(), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("backend_kind", sa.String(32), nullable=False),
        sa.Column("versions", JSON, nullable=False),
        sa.Column("git_commit", sa.String(64), nullable=True),
        sa.Column("hardware", JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", utc(), nullable=False),
        sa.Column("started_at", utc(), nullable=True),
        sa.Column("finished_at", utc(), nullable=True),
        sa.CheckConstraint(STATUS_CHECK, name=op.f("ck_experiments_status")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experiments")),
    )
    op.create_index(op.f("ix_experiments_status"), "experiments", ["status"])
    op.create_index(op.f("ix_experiments_created_at"), "experiments", ["created_at"])

    op.create_table(
        "trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("config_name", sa.Text(), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("worker_id", sa.Text(), nullable=True),
        sa.Column("claimed_at", utc(), nullable=True),
        sa.Column("heartbeat_at", utc(), nullable=True),
        sa.Column("started_at", utc(), nullable=True),
        sa.Column("finished_at", utc(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("items_total", sa.Integer(), nullable=True),
        sa.Column("items_done", sa.Integer(), nullable=False),
        sa.CheckConstraint(STATUS_CHECK, name=op.f("ck_trials_status")),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE",
                                name=op.f("fk_trials_experiment_id_experiments")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trials")),
        sa.UniqueConstraint("experiment_id", "position", name=op.f("uq_trials_experiment_id_position")),
    )
    op.create_index(op.f("ix_trials_status_experiment_id_position"), "trials",
                    ["status", "experiment_id", "position"])

    op.create_table(
        "item_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("item_id", sa.Text(), nullable=False),
        sa.Column("task", sa.String(64), nullable=False),
        sa.Column("config_name", sa.Text(), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("context_length", sa.Integer(), nullable=False),
        sa.Column("depth", sa.Double(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("context_tokens", sa.Integer(), nullable=False),
        sa.Column("kept_tokens", sa.Double(), nullable=True),
        sa.Column("kept_fraction", sa.Double(), nullable=True),
        sa.Column("baseline_kv_bytes", sa.BigInteger(), nullable=False),
        sa.Column("physical_kv_bytes", sa.BigInteger(), nullable=False),
        sa.Column("analytic_kv_bytes", sa.BigInteger(), nullable=False),
        sa.Column("compression_ratio", sa.Double(), nullable=True),
        sa.Column("peak_kv_bytes", sa.BigInteger(), nullable=False),
        sa.Column("generated", sa.Text(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("ttft_s", sa.Double(), nullable=True),
        sa.Column("tpot_s", sa.Double(), nullable=True),
        sa.Column("prefill_s", sa.Double(), nullable=True),
        sa.Column("compress_s", sa.Double(), nullable=True),
        sa.Column("decode_s", sa.Double(), nullable=True),
        sa.Column("peak_memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("score", sa.Double(), nullable=True),
        sa.Column("nll", sa.Double(), nullable=True),
        sa.Column("nll_tokens", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("extra", JSON, nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE",
                                name=op.f("fk_item_results_experiment_id_experiments")),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"], ondelete="CASCADE",
                                name=op.f("fk_item_results_trial_id_trials")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_item_results")),
        sa.UniqueConstraint("trial_id", "item_id", "task", name=op.f("uq_item_results_trial_id_item_id_task")),
    )
    op.create_index(op.f("ix_item_results_experiment_id"), "item_results", ["experiment_id"])

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=True),
        sa.Column("ts", sa.Double(), nullable=False),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE",
                                name=op.f("fk_events_experiment_id_experiments")),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"], ondelete="CASCADE",
                                name=op.f("fk_events_trial_id_trials")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index(op.f("ix_events_experiment_id_ts"), "events", ["experiment_id", "ts"])


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("item_results")
    op.drop_table("trials")
    op.drop_table("experiments")
