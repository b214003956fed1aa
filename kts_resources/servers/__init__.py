"""The servers kts starts under a ``KTS_HOME`` and leaves running for later processes: how they are
found, whether they are alive, the watchdog that stops them with their home, and ``kts services``."""
