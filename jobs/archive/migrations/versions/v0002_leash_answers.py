"""leash_answers: the request cache's answers once they left Redis."""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leash_answers",
        sa.Column("entry", sa.String(300), primary_key=True),
        sa.Column("answer", sa.Text, nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("leash_answers_used", "leash_answers", ["used_at"])


def downgrade() -> None:
    op.drop_table("leash_answers")
