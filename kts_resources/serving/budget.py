"""The server-wide memory budget for fetch responses: what `kts serve` reads for a fetch is held in
memory until the client has taken it, so the sum over every connection is capped, whatever each
client's fetch.max.bytes says (a request's max_bytes is an int32: up to 2 GiB).

A fetch reserves a grant before it reads: its own cap, but no more than an equal share of the
budget among the fetches holding or waiting (so one large fetch cannot take it all), and no more
than what is free. It waits only while less than ``MIN_GRANT`` is free, in arrival order. The
response may exceed its grant by one batch (a batch goes out whole, KIP-74), so the response's
real size is charged once it is known; the grant is released when the response has left the
process's buffers, or the connection is closed (a client that stops reading is cut off, sooner
while others wait for the budget, so it cannot hold it for ever)."""

from __future__ import annotations

import asyncio
import collections

MIN_GRANT = 1024 * 1024


class ByteBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.holders = 0
        self._waiting: collections.deque[asyncio.Future] = collections.deque()

    async def reserve(self, want: int) -> int:
        """A grant of at most ``want`` bytes (at least MIN_GRANT, or ``want`` when smaller)."""
        want = max(0, want)
        need = min(want, MIN_GRANT)
        if self._waiting or self.limit - self.used < need:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                while True:
                    await waiter
                    if self.limit - self.used >= need:
                        break
                    waiter = asyncio.get_running_loop().create_future()
                    self._waiting.appendleft(waiter)  # still first in line
            except asyncio.CancelledError:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
                else:
                    self._wake()  # woken, then cancelled: the next in line goes instead
                raise
        share = self.limit // (self.holders + len(self._waiting) + 1)
        grant = max(0, min(want, max(MIN_GRANT, share), self.limit - self.used))
        self.used += grant
        self.holders += 1
        self._wake()
        return grant

    @property
    def contended(self) -> bool:
        """Whether a fetch waits for memory."""
        return bool(self._waiting)

    def charge(self, grant: int, size: int) -> int:
        """Charge ``size`` (the response's real size) instead of ``grant``; returns what is now held."""
        self.used += size - grant
        self._wake()
        return size

    def release(self, held: int) -> None:
        self.used -= held
        self.holders -= 1
        self._wake()

    def _wake(self) -> None:
        # The first in line tries again; it wakes the next when it has taken its grant.
        if self._waiting and self.limit - self.used >= MIN_GRANT:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
