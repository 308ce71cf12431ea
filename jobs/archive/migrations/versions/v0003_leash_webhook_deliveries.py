"""leash_webhook_deliveries: every attempt of a job's completion webhook, kept past its record's short log."""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leash_webhook_deliveries",
        sa.Column("delivery_id", sa.String(200), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seconds", sa.Float),
        sa.Column("status", sa.Integer),
        sa.Column("error", sa.Text),
    )
    op.create_index("leash_webhook_deliveries_job", "leash_webhook_deliveries", ["job_id"])
    op.create_index("leash_webhook_deliveries_at", "leash_webhook_deliveries", ["at"])


def downgrade() -> None:
    op.drop_table("leash_webhook_deliveries")
