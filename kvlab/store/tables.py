"""SQLAlchemy 2 ORM models: the tables of the experiment store.

The migrations in ``db/migrations`` create exactly these tables; a change here needs a new
revision there (``alembic -c db/alembic.ini revision --autogenerate -m "..."``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from kvlab.store.records import CANDIDATE_STATES, STATUSES, TUNE_STATES

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: JSON everywhere; JSONB on PostgreSQL so that containment (``tags @> '["x"]'``) works.
JSONType = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend.

    SQLite has no time zone type: values are stored as naive UTC text (so that comparisons in SQL
    stay correct) and come back with ``tzinfo=UTC``.  PostgreSQL stores ``timestamptz``.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass an aware one, e.g. datetime.now(UTC)")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _status_check(column: str, statuses: tuple[str, ...] = STATUSES) -> CheckConstraint:
    allowed = ", ".join(f"'{s}'" for s in statuses)
    return CheckConstraint(f"{column} IN ({allowed})", name=column)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class ExperimentRow(Base):
    __tablename__ = "experiments"
    __table_args__ = (
        _status_check("status"),
        Index(None, "status"),
        Index(None, "created_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    tags: Mapped[list[str]] = mapped_column(JSONType)
    notes: Mapped[str] = mapped_column(Text)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONType)
    seed: Mapped[int] = mapped_column(BigInteger)
    model: Mapped[str] = mapped_column(Text)
    backend_kind: Mapped[str] = mapped_column(String(32))
    versions: Mapped[dict[str, Any]] = mapped_column(JSONType)
    git_commit: Mapped[str | None] = mapped_column(String(64))
    hardware: Mapped[dict[str, Any]] = mapped_column(JSONType)
    status: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class TrialRow(Base):
    """One config of an experiment.  The unique (experiment_id, position) also serves lookups by
    experiment; the status index leads with status and ends in the claim order."""

    __tablename__ = "trials"
    __table_args__ = (
        _status_check("status"),
        UniqueConstraint("experiment_id", "position"),
        Index(None, "status", "experiment_id", "position"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    config_name: Mapped[str] = mapped_column(Text)
    config: Mapped[dict[str, Any]] = mapped_column(JSONType)
    status: Mapped[str] = mapped_column(String(16))
    worker_id: Mapped[str | None] = mapped_column(Text)
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    attempts: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    items_total: Mapped[int | None] = mapped_column(Integer)
    items_done: Mapped[int] = mapped_column(Integer)
    item_limit: Mapped[int | None] = mapped_column(Integer)  # only the first N items (a tune's rounds)


class ItemResultRow(Base):
    """A :class:`kvlab.core.results.ItemResult`, one column per field.

    The float measurements are nullable although ItemResult's are not: SQLite stores NaN as NULL,
    and the store reads NULL back as NaN for those fields.
    """

    __tablename__ = "item_results"
    __table_args__ = (
        UniqueConstraint("trial_id", "item_id", "task"),
        Index(None, "experiment_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    item_id: Mapped[str] = mapped_column(Text)
    task: Mapped[str] = mapped_column(String(64))
    config_name: Mapped[str] = mapped_column(Text)
    config: Mapped[dict[str, Any]] = mapped_column(JSONType)
    seed: Mapped[int] = mapped_column(BigInteger)
    context_length: Mapped[int] = mapped_column(Integer)
    depth: Mapped[float | None] = mapped_column(Double)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    context_tokens: Mapped[int] = mapped_column(Integer)
    kept_tokens: Mapped[float | None] = mapped_column(Double)
    kept_fraction: Mapped[float | None] = mapped_column(Double)
    baseline_kv_bytes: Mapped[int | None] = mapped_column(BigInteger)
    physical_kv_bytes: Mapped[int | None] = mapped_column(BigInteger)
    analytic_kv_bytes: Mapped[int | None] = mapped_column(BigInteger)
    compression_ratio: Mapped[float | None] = mapped_column(Double)
    peak_kv_bytes: Mapped[int | None] = mapped_column(BigInteger)
    generated: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)
    output_tokens: Mapped[int] = mapped_column(Integer)
    ttft_s: Mapped[float | None] = mapped_column(Double)
    tpot_s: Mapped[float | None] = mapped_column(Double)
    prefill_s: Mapped[float | None] = mapped_column(Double)
    compress_s: Mapped[float | None] = mapped_column(Double)
    decode_s: Mapped[float | None] = mapped_column(Double)
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    score: Mapped[float | None] = mapped_column(Double)
    nll: Mapped[float | None] = mapped_column(Double)
    nll_tokens: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    extra: Mapped[dict[str, Any]] = mapped_column(JSONType)
    score_s: Mapped[float | None] = mapped_column(Double)
    first_token_s: Mapped[float | None] = mapped_column(Double)
    kv_bytes_estimated: Mapped[bool] = mapped_column(Boolean, server_default=false())


class TelemetryRow(Base):
    __tablename__ = "telemetry"
    __table_args__ = (
        Index(None, "experiment_id", "ts"),
        Index(None, "trial_id", "ts"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    worker_id: Mapped[str] = mapped_column(Text)
    ts: Mapped[float] = mapped_column(Double)
    phase: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(String(16))
    rss_bytes: Mapped[int | None] = mapped_column(BigInteger)
    cpu_percent: Mapped[float | None] = mapped_column(Double)
    kv_bytes: Mapped[int | None] = mapped_column(BigInteger)
    gpu_memory_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    gpu_memory_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    gpu_utilization: Mapped[float | None] = mapped_column(Double)
    gpu_power_w: Mapped[float | None] = mapped_column(Double)
    gpu_temperature_c: Mapped[float | None] = mapped_column(Double)
    process_gpu_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)


class EventRow(Base):
    __tablename__ = "events"
    __table_args__ = (Index(None, "experiment_id", "ts"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    ts: Mapped[float] = mapped_column(Double)
    level: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)


class TuneRow(Base):
    """A ``kvlab tune`` search on one experiment: its Optuna study and the driver that runs its rounds.

    While ``state`` is running the experiment stays open even when every trial has ended (the
    driver adds the next round's); the driver's heartbeat (``driver_seen_at``) lets another
    ``kvlab tune --resume`` take over after a crash.
    """

    __tablename__ = "tunes"
    __table_args__ = (_status_check("state", TUNE_STATES),)

    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    study_name: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))
    driver_id: Mapped[str | None] = mapped_column(Text)
    driver_seen_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    grid_points: Mapped[int] = mapped_column(Integer)
    grid_item_evals: Mapped[int] = mapped_column(Integer)
    recommendation: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    note: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class TuneCandidateRow(Base):
    """A tune's verdict on one trial: how far it got, and why it stopped (the baseline has one too)."""

    __tablename__ = "tune_candidates"
    __table_args__ = (_status_check("state", CANDIDATE_STATES), Index(None, "experiment_id"))

    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    number: Mapped[int | None] = mapped_column(Integer)  # the Optuna trial number (None: the baseline)
    rung: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    judged_items: Mapped[int] = mapped_column(Integer)
    accuracy: Mapped[float | None] = mapped_column(Double)
    diff: Mapped[float | None] = mapped_column(Double)
    diff_low: Mapped[float | None] = mapped_column(Double)
    diff_high: Mapped[float | None] = mapped_column(Double)
    kv_bytes: Mapped[float | None] = mapped_column(Double)
    ttft_ms: Mapped[float | None] = mapped_column(Double)
    tpot_ms: Mapped[float | None] = mapped_column(Double)
    judged_at: Mapped[float | None] = mapped_column(Double)
    acceptable: Mapped[bool | None] = mapped_column(Boolean)  # the sweet-spot rule on its items, uncorrected
    mean_kl: Mapped[float | None] = mapped_column(Double)
    kl_high: Mapped[float | None] = mapped_column(Double)


class LoadLevelRow(Base):
    """One config's server at one load level (a ``[load]`` table's): the client's figures and the server's, as
    :class:`kvlab.load.metrics.LevelResult` serializes them."""

    __tablename__ = "load_levels"
    __table_args__ = (UniqueConstraint("trial_id", "mode", "level"), Index(None, "experiment_id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    config_name: Mapped[str] = mapped_column(Text)
    mode: Mapped[str] = mapped_column(String(16))
    level: Mapped[float] = mapped_column(Double)
    result: Mapped[dict[str, Any]] = mapped_column(JSONType)
