"""leash_jobs and leash_items: every ended job and its items."""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leash_jobs",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(100), nullable=False),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("name", sa.String(200)),
        sa.Column("queue", sa.String(100)),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("done", sa.Integer, nullable=False),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("item_errors", sa.Integer, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True)),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_month", sa.String(7), nullable=False),
        sa.Column("ended_day", sa.String(10), nullable=False),
        sa.Column("archived_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("calls", sa.BigInteger, nullable=False),
        sa.Column("input_tokens", sa.BigInteger, nullable=False),
        sa.Column("output_tokens", sa.BigInteger, nullable=False),
        sa.Column("cost_usd", sa.Float),
        sa.Column("record", sa.Text, nullable=False),
        sa.Column("errors", sa.Text, nullable=False),
        sa.Column("history", sa.Text, nullable=False),
        sa.Column("usage", sa.Text, nullable=False),
        sa.Column("estimate", sa.Text),
        sa.Column("payload", sa.Text),
    )
    op.create_index("leash_jobs_owner_ended", "leash_jobs", ["owner", "ended_at"])
    op.create_index("leash_jobs_state_kind", "leash_jobs", ["state", "kind"])
    op.create_index("leash_jobs_ended", "leash_jobs", ["ended_at"])
    op.create_table(
        "leash_items",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("item", sa.Text),
        sa.Column("result", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("usage", sa.String(100)),
    )


def downgrade() -> None:
    op.drop_table("leash_items")
    op.drop_table("leash_jobs")
