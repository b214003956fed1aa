"""Many ``kts`` commands in one process, for tests that ask a user's dozen questions at a time.

``python -m tests.cli_session`` reads a JSON list of argument lists on stdin, runs each through
``kts_assets.cli.main`` — the parser, the command and its printing, exactly as ``kts`` runs them —
with its stdout captured, and prints a JSON list of ``{"status", "stdout"}``. The commands see the
process's environment, as separate ``kts`` processes would; what they share is only the start-up
(~1.5 s of imports and connections per command), which is what made such tests slow.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def main() -> None:
    from kts_assets.cli.main import main as kts_main

    results = []
    for argv in json.load(sys.stdin):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = kts_main(argv)
        results.append({"status": status, "stdout": out.getvalue()})
    json.dump(results, sys.__stdout__)


if __name__ == "__main__":
    main()
