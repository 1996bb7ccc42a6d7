"""The server's edge: waitress (https://docs.pylonsproject.org/projects/waitress/) with every
client bounded in time and in connections, so that no client (nor one address's many) can
keep others out.

Waitress closes a connection idle for ``channel_timeout`` seconds, but one that sends a header
line every few seconds is never idle: 1,100 such connections (~70 bytes/s in all) filled the
1,000-connection limit, waitress stopped accepting, and every new visitor waited forever. Here:

* **deadlines**: a request's headers must be complete :data:`HEADER_TIMEOUT_S` seconds after its
  first byte (a connection's first request: after it opened), its body within
  :data:`BODY_TIMEOUT_S` plus a second per :data:`BODY_MIN_BYTES_PER_S` bytes it announced;
  past them the connection is closed (checked every ``cleanup_interval``).
* **never full**: the server always accepts. Past ``connection_limit`` connections, or past
  :data:`CLIENT_CONNECTIONS` from the accepting address, a connection that is not being
  answered is closed to make room: an idle one first (a browser opens another when it needs
  it), then the one whose headers have been arriving longest, then the slowest upload: of the
  address over its share, else of the address holding most connections. A connection whose
  request is being answered is never closed for room.

Behind a reverse proxy every client has the proxy's address: there ``--client-connections 0``
leaves the per-address share to the proxy (README: a team's deployment). This module imports
waitress only; :mod:`app.cli` serves through :func:`make_server`.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import MultiSocketServer, TcpWSGIServer
from waitress.task import ThreadedTaskDispatcher

__all__ = ["make_server", "EdgeServer", "EdgeChannel", "HEADER_TIMEOUT_S", "BODY_TIMEOUT_S", "BODY_MIN_BYTES_PER_S",
           "CLIENT_CONNECTIONS"]

#: seconds a request's headers may take from its first byte (RFC 9112 sets none; nginx's
#: client_header_timeout is 60 s between reads, Apache's mod_reqtimeout header=20-40,MinRate=500)
HEADER_TIMEOUT_S = 10.0
#: seconds a request's body may take, plus its announced length at :data:`BODY_MIN_BYTES_PER_S`
#: (Apache mod_reqtimeout's body=20,MinRate=500 in spirit: a 16 MB upload over a 1 Mbit/s link
#: takes ~130 s and gets 20 + 320 s)
BODY_TIMEOUT_S = 20.0
BODY_MIN_BYTES_PER_S = 50_000
#: connections one address may hold before its own waiting ones make room for its next (a
#: browser opens about six per site; a classroom behind one NAT address, a few dozen browsers)
CLIENT_CONNECTIONS = 256


class EdgeChannel(HTTPChannel):
    """A waitress channel that knows when its current request began (see the module)."""

    def __init__(self, server: Any, sock: Any, addr: Any, adj: Any, map: Any = None) -> None:
        self.addr = addr  # (known before waitress registers the channel: add_channel files it by address)
        super().__init__(server, sock, addr, adj, map=map)
        self.request_started = self.creation_time  #: when the request being read began (s)
        self.began = 0  #: requests begun on the connection

    def received(self, data: bytes) -> bool:
        if self.request is None and data:
            self.request_started = time.time()
            self.began += 1
        return super().received(data)

    def client(self) -> str:
        """The address the connection came from (host only)."""
        addr = getattr(self, "addr", None)
        return str(addr[0]) if isinstance(addr, tuple) and addr else str(addr)

    def add_channel(self, map: Any = None) -> None:
        super().add_channel(map)
        by = getattr(self.server, "by_client", None)
        if by is not None:
            by.setdefault(self.client(), set()).add(self)

    def del_channel(self, map: Any = None) -> None:
        by = getattr(self.server, "by_client", None)
        if by is not None:
            mine = by.get(self.client())
            if mine is not None:
                mine.discard(self)
                if not mine:
                    del by[self.client()]
        super().del_channel(map)

    def overdue(self, now: float) -> str | None:
        """Why the connection is past its deadline (None when it is not, or is being answered)."""
        if self.requests or self.will_close:
            return None
        req = self.request
        if req is None and self.began:
            return None  # (idle between requests: waitress's channel_timeout)
        if req is None or not req.headers_finished:  # (a new connection counts from its opening)
            return "headers" if now - self.request_started > HEADER_TIMEOUT_S else None
        allowed = BODY_TIMEOUT_S + float(getattr(req, "content_length", 0) or 0) / BODY_MIN_BYTES_PER_S
        return "body" if now - self.request_started > allowed else None

    def room_rank(self) -> tuple[int, float] | None:
        """How readily the connection is closed to make room (lower first; None: never, it is
        being answered or already closing): idle, then oldest headers, then slowest body."""
        if self.requests or self.will_close or self.close_when_flushed or self.total_outbufs_len:
            return None
        req = self.request
        if req is None and self.began:
            return 0, self.last_activity
        return (1, self.request_started) if req is None or not req.headers_finished else (2, self.request_started)


class EdgeServer(TcpWSGIServer):
    """waitress's TCP server with deadlines and room made, never a full stop (see the module)."""

    channel_class = EdgeChannel
    #: connections closed past a deadline or for room, by why (for the logs and the tests)
    closed: Counter

    def __init__(self, *a: Any, client_connections: int = CLIENT_CONNECTIONS, **kw: Any) -> None:
        self.client_connections = client_connections
        self.closed = Counter()
        #: address -> its open connections (kept as they open and close: an accept looks at its
        #: own address's, not at every connection's: 1,100 of them, thousands of accepts a second)
        self.by_client: dict[str, set] = {}
        #: called with the server after each round of deadlines, from its own loop (nothing is
        #: accepted meanwhile): :meth:`app.recycle.Recycler.check` where the server may start again
        self.after_maintenance: Any = None
        super().__init__(*a, **kw)

    def readable(self) -> bool:  # (waitress's stops accepting at the limit: here, room is made)
        now = time.time()
        if now >= self.next_channel_cleanup:
            self.next_channel_cleanup = now + self.adj.cleanup_interval
            self.maintenance(now)
        return bool(self.accepting)

    def maintenance(self, now: float) -> None:
        super().maintenance(now)
        for ch in list(self.active_channels.values()):
            why = ch.overdue(now) if isinstance(ch, EdgeChannel) else None
            if why:
                ch.will_close = True
                self.closed[why] += 1
        if self.after_maintenance is not None:
            self.after_maintenance(self)

    def handle_accept(self) -> None:
        n = len(self.active_channels)
        super().handle_accept()
        if len(self.active_channels) == n:
            return  # (nothing accepted)
        mine = self.active_channels[next(reversed(self.active_channels))]  # (the newest: added last)
        if not isinstance(mine, EdgeChannel):
            return
        own = [ch for ch in self.by_client.get(mine.client(), ()) if ch is not mine and not ch.will_close]
        if self.client_connections and len(own) >= self.client_connections:
            self._make_room(own, "client share")
        elif len(self.active_channels) > self.adj.connection_limit:
            top = max(self.by_client, key=lambda c: len(self.by_client[c]))  # (the address holding most)
            crowd = [ch for ch in self.by_client[top] if ch is not mine and not ch.will_close]
            if not self._make_room(crowd, "limit"):
                self._make_room([ch for ch in self.active_channels.values()
                                 if isinstance(ch, EdgeChannel) and ch is not mine and not ch.will_close], "limit")

    def _make_room(self, candidates: list[EdgeChannel], why: str) -> bool:
        ranked = [(r, ch) for ch in candidates if (r := ch.room_rank()) is not None]
        if not ranked:
            return False
        _, ch = min(ranked, key=lambda x: x[0])
        ch.will_close = True
        self.closed[why] += 1
        return True


def make_server(app: Any, host: str, port: int, client_connections: int = CLIENT_CONNECTIONS,
                sockets: list[int] | None = None, **opts: Any) -> Any:
    """What ``waitress.create_server`` makes for ``host:port``, through :class:`EdgeServer`:
    one server per address ``host`` resolves to (``server.run()`` serves them all). With
    ``sockets`` (descriptors of TCP sockets already listening: a server started again in place,
    :mod:`app.recycle`), those instead of ``host:port``. Either way ``.edge_servers`` lists the
    :class:`EdgeServer` of each socket."""
    import socket

    if sockets:
        socks = [socket.socket(fileno=fd) for fd in sockets]
        for sk in socks:
            sk.set_inheritable(False)
        adj = Adjustments(sockets=socks, **opts)
        made = [(sk, (sk.family, sk.type, sk.proto, sk.getsockname())) for sk in socks]
    else:
        adj = Adjustments(host=host, port=port, **opts)
        made = [(None, info) for info in adj.listen]
    dispatcher = ThreadedTaskDispatcher()
    dispatcher.set_thread_count(adj.threads)
    smap: dict = {}
    servers = [EdgeServer(app, smap, True, sk, dispatcher=dispatcher, adj=adj, sockinfo=info, bind_socket=sk is None,
                          client_connections=client_connections) for sk, info in made]
    if len(servers) == 1:
        servers[0].edge_servers = servers
        return servers[0]
    multi = MultiSocketServer(smap, adj, [(s.effective_host, s.effective_port) for s in servers], dispatcher)
    multi.edge_servers = servers
    return multi
