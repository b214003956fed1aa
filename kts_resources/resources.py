"""Dagster resources wrapping kts's outside world. The format code they use imports no Dagster."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from kts_resources.kafka.logdir import Discovery, LogDir


class KafkaLogDirsResource(dg.ConfigurableResource):
    """The broker log dirs kts reads (``KTS_LOG_DIRS``), and which of them kts owns.

    kts never edits files in a dir a live broker owns; ``owned_log_dirs`` names the dirs it may
    apply local retention to (a stopped broker, a mirror, a staging area).
    """

    log_dirs: str
    owned_log_dirs: str = ""

    def paths(self) -> list[Path]:
        return [Path(p.strip()).expanduser() for p in self.log_dirs.split(",") if p.strip()]

    def owned_paths(self) -> set[Path]:
        return {Path(p.strip()).expanduser().resolve() for p in self.owned_log_dirs.split(",") if p.strip()}

    def is_owned(self, log_dir: Path) -> bool:
        return log_dir.resolve() in self.owned_paths()

    def discover(self) -> list[tuple[LogDir, Discovery]]:
        """Every existing log dir with the partitions found in it (missing dirs are skipped)."""
        found = []
        for path in self.paths():
            if path.is_dir():
                log_dir = LogDir(path)
                found.append((log_dir, log_dir.discover()))
        return found
