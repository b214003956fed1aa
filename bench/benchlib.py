"""What every bench script shares: the repository on ``sys.path``, progress lines, the ``--json``
option and where results go, the git state measured, and the text tables.

A bench runs as ``.venv/bin/python bench/<name>_bench.py``; Python puts ``bench/`` first on
``sys.path``, which is safe because no file here is named like a standard module.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

RESULTS = REPO_ROOT / "bench" / "results"


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def default_json(name: str) -> Path:
    """``bench/results/<name>.json`` (git-ignored)."""
    return RESULTS / f"{name}.json"


def add_json_argument(parser: argparse.ArgumentParser, name: str) -> None:
    default = default_json(name)
    parser.add_argument("--json", type=Path, default=default,
                        help=f"where to write the results (default {default.relative_to(REPO_ROOT)})")


def write_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    progress(f"wrote {path}")


def git_state() -> dict:
    """The commit measured and the tracked files that differed from it (others may be editing
    the working tree: the numbers are for the code as it was on disk)."""
    def git(*argv: str) -> str:
        r = subprocess.run(["git", *argv], cwd=REPO_ROOT, check=False, capture_output=True, text=True)
        return r.stdout.rstrip("\n") if r.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD") or None,
            "modified": [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]}


def format_rows(rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    """A text table: the first row is the header, underlined; columns in ``right`` right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, r in enumerate(rows):
        cells = [f"{c:>{widths[j]}}" if j in right else f"{c:<{widths[j]}}" for j, c in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("-" * len(lines[0]))
    return lines
