"""A partial index of the finished segments whose manifest is not recorded yet: the copy pass asks
it for segments to write a manifest for (copied before manifests existed), which costs one probe
of an index that is empty once every finished segment has its manifest.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels = None
depends_on = None

WITHOUT_MANIFEST = "state = 'COPY_SEGMENT_FINISHED' AND NOT (custom_metadata ? 'manifest.key')"


def upgrade() -> None:
    op.create_index("remote_segments_without_manifest", "remote_segments", ["topic_id", "partition", "start_offset"],
                    postgresql_where=sa.text(WITHOUT_MANIFEST))


def downgrade() -> None:
    op.drop_index("remote_segments_without_manifest", table_name="remote_segments")
