"""The users `kts serve` authenticates over SASL/SCRAM (issue 29, "safe to expose"): each user's
salted SCRAM credential per mechanism, as Kafka keeps it (salt, StoredKey, ServerKey, iterations),
never the password.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scram_credentials",
        sa.Column("user_name", sa.Text, primary_key=True),
        sa.Column("mechanism", sa.Text, primary_key=True),
        sa.Column("salt", sa.LargeBinary, nullable=False),
        sa.Column("stored_key", sa.LargeBinary, nullable=False),
        sa.Column("server_key", sa.LargeBinary, nullable=False),
        sa.Column("iterations", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("scram_credentials")
