"""The ``kts`` command line, a thin layer over kts_resources and the pipeline.

- ``entry``: the installed ``kts`` (a sync in the standing CLI server, the rest here); ``python -m kts_assets.cli``.
- ``main``: the parser and a command run in this process, each error one line and an exit status.
- ``common``: exit statuses, CommandError, argument types, printing; ``environment``: the metadata
  store and remote tier a command opens.
- Commands: ``inspection`` (segments, dump, index, simulate), ``sync`` (sync, status, ack-loss),
  ``read`` (fetch, offsets, broker-config), ``admin`` (config, delete-records, topic delete),
  ``maintenance`` (recover, restore, scrub), ``services`` (services, spark), ``serve``, ``users``
  (users add, delete, list), ``dagster_ui`` (ui, code-server).
- ``server``: the standing CLI server a sync runs in (its children run ``main.run_here``; ``entry``
  is its client, and ``kts services`` reaches it through kts_resources.servers, so no cycle).
"""
