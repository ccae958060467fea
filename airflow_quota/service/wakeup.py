"""Waking the leader's idle wait from another thread: a self-pipe, so one ``select`` waits on it
together with the PostgreSQL connection that LISTENs for new requests."""

from __future__ import annotations

import contextlib
import selectors
import socket


class Wakeup:
    """Set from any thread or a signal handler; the leader's wait returns at once when it was
    set since the last wait, or as soon as it is set during one. Open between ``open`` and
    ``close`` (``QuotaService.run``); a set while closed does nothing, as nothing waits then."""

    def __init__(self) -> None:
        self._pair: tuple[socket.socket, socket.socket] | None = None
        """(reader, writer) while open."""

    def open(self) -> None:
        if self._pair is None:
            reader, writer = socket.socketpair()
            reader.setblocking(False)
            writer.setblocking(False)
            self._pair = (reader, writer)

    def set(self) -> None:
        """Wake the wait in progress, or the next one. Takes no lock: safe in a signal handler."""
        pair = self._pair
        if pair is None:
            return
        with contextlib.suppress(OSError):  # full: a wake is pending already; closed: nothing waits
            pair[1].send(b"\0")

    def wait(self, timeout: float, also: int | None = None) -> bool:
        """Wait until set, ``also`` (a file descriptor) is readable, or ``timeout`` seconds pass;
        True when set. Wakes that came before or during the wait are used up."""
        self.open()
        assert self._pair is not None
        reader = self._pair[0]
        with selectors.DefaultSelector() as selector:
            selector.register(reader, selectors.EVENT_READ)
            if also is not None:
                selector.register(also, selectors.EVENT_READ)
            ready = selector.select(timeout)
        woken = any(key.fileobj is reader for key, _ in ready)
        if woken:
            with contextlib.suppress(BlockingIOError):
                while reader.recv(4096):
                    pass
        return woken

    def close(self) -> None:
        pair, self._pair = self._pair, None
        if pair is not None:
            for end in pair:
                end.close()
