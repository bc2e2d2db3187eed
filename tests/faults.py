"""Fault injection for tests with real processes: a loopback TCP proxy you control.

Put it between a process and a service you must not stop (PostgreSQL and Redis here are
shared by other people's tests), then break the path, not the service:

    with TcpProxy(5432) as proxy:                      # forwards 127.0.0.1:<proxy.port> -> 127.0.0.1:5432
        env["DATABASE_URL"] = proxy.url("postgres://postgres@127.0.0.1:5432/test_x")
        ...                                            # start the process under test
        proxy.cut()      # an outage: open connections are reset, new ones are reset at once
        proxy.restore()  # the service is back: new connections are forwarded again
        proxy.stall()    # a hang: connections stay open but no byte moves either way
        proxy.restore()  # (held bytes then flow on)

`cut()` resets rather than refuses (the port stays bound, so the URL stays valid): a
client sees "server closed the connection unexpectedly", as after a PostgreSQL restart.
`accepted` counts connections taken since start and `open` those forwarding now, so a
test can wait for a client to (re)connect instead of sleeping. Threads, no event loop:
usable from sync tests, async tests and fixtures alike. `stop()` (or leaving the `with`)
closes everything; all methods are idempotent and thread-safe.
"""

import socket
import struct
import threading
from urllib.parse import urlsplit, urlunsplit

__all__ = ["TcpProxy"]


class TcpProxy:
    """Forward `listen_host:port` (an ephemeral port by default) to `target_host:target_port`."""

    def __init__(self, target_port, target_host="127.0.0.1", *, listen_host="127.0.0.1", port=0):
        self.target = (target_host, int(target_port))
        self._listen = (listen_host, port)
        self._server = None
        self._pairs = set()
        self._lock = threading.Lock()
        self._up = threading.Event()  # forwarding (not cut)
        self._flowing = threading.Event()  # bytes move (not stalled)
        self._stopped = threading.Event()
        self._thread = None
        self.accepted = 0

    # --- control -------------------------------------------------------------------------

    def start(self):
        """Bind and start forwarding. Returns self."""
        if self._server is not None:
            return self
        self._server = socket.create_server(self._listen)
        self._server.settimeout(0.1)  # so stop() is noticed
        self._up.set()
        self._flowing.set()
        self._thread = threading.Thread(target=self._accept_loop, name=f"tcp-proxy-{self.port}", daemon=True)
        self._thread.start()
        return self

    @property
    def port(self):
        return self._server.getsockname()[1]

    @property
    def open(self):
        """Connections forwarding now."""
        with self._lock:
            return len(self._pairs)

    def url(self, url):
        """`url` with its host and port replaced by this proxy's (user, path, query kept)."""
        parts = urlsplit(url)
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth}@" if auth else ""
        return urlunsplit(parts._replace(netloc=f"{netloc}{self._listen[0]}:{self.port}"))

    def cut(self):
        """Reset every open connection and every new one until `restore()`."""
        self._up.clear()
        self._flowing.set()  # a stalled pump must wake to notice the cut
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.close(reset=True)

    def stall(self):
        """Keep connections (and new ones) open but move no byte until `restore()`."""
        self._flowing.clear()

    def restore(self):
        """Forward again: new connections reach the target; stalled bytes flow on."""
        self._up.set()
        self._flowing.set()

    def stop(self):
        """Close the listener and every connection. Idempotent."""
        self._stopped.set()
        self.cut()
        if self._thread is not None:
            self._thread.join(5)
        if self._server is not None:
            self._server.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # --- forwarding ----------------------------------------------------------------------

    def _accept_loop(self):
        while not self._stopped.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            if not self._up.is_set():
                _Pair(client, None, self).close(reset=True)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _Pair(client, None, self).close(reset=True)
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            pair = _Pair(client, upstream, self)
            with self._lock:
                self._pairs.add(pair)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=pair.pump, args=(src, dst), daemon=True).start()


class _Pair:
    def __init__(self, client, upstream, proxy):
        self.sockets = [s for s in (client, upstream) if s is not None]
        self.proxy = proxy
        self._closed = False
        self._lock = threading.Lock()

    def pump(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self.proxy._flowing.wait()
                if not self.proxy._up.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        self.close()

    def close(self, reset=False):
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with self.proxy._lock:
            self.proxy._pairs.discard(self)
        for sock in self.sockets:
            try:
                if reset:  # RST, not FIN: the peer fails at once instead of waiting
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                # Wakes a pump blocked in recv() (close() from another thread does not);
                # SHUT_RD sends nothing, so a reset stays a reset.
                sock.shutdown(socket.SHUT_RD if reset else socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
