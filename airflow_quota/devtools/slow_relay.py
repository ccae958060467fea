"""A TCP relay that holds each connection for a while before passing it on: an api-server that
answers slowly, for testing what the demo does when the workers' calls to the execution API time
out (as they did on a loaded two-core machine, where the api-server took 38 s to answer)."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from types import TracebackType


class _Handler(socketserver.BaseRequestHandler):
    server: SlowRelay

    def handle(self) -> None:
        if self.server.closing.wait(self.server.delay):
            return
        try:
            upstream = socket.create_connection(self.server.target, timeout=10)
        except OSError:
            return
        with upstream:
            upstream.settimeout(None)
            back = threading.Thread(target=_pipe, args=(upstream, self.request), daemon=True)
            back.start()
            _pipe(self.request, upstream)
            back.join(timeout=60)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes until either side closes."""
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


class SlowRelay(socketserver.ThreadingTCPServer):
    """Listens on a free port of 127.0.0.1 and relays each connection to ``target`` after
    ``delay`` seconds; ``with SlowRelay(...) as relay`` serves it in a thread."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.target = target
        self.delay = delay
        self.closing = threading.Event()
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def __enter__(self) -> SlowRelay:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.closing.set()
        self.shutdown()
        self.server_close()
