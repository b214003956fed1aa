"""``python -m kts_assets.cli``: the ``kts`` command."""

from kts_assets.cli.entry import entry_point

entry_point()
