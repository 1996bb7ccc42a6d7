"""Who a request comes from, for fair use (:mod:`app.store`'s per-client bounds and its fair
queue): the address the connection came from, or, behind a reverse proxy the server was told to
trust (``soapbox serve --trusted-proxy ADDR``), the address that proxy says it forwarded
(the last ``X-Forwarded-For`` entry: the one the proxy added itself). A session is not a
client: a page costs nothing to open, and one visitor's hundred pages are one client.

Outside a request (tests, the command line, a worker) the client is ``""``: not a visitor, so
no per-client bound applies to it.
"""

from __future__ import annotations

__all__ = ["client_address", "trust_proxy", "LOCAL"]

#: the client outside a request (no per-client bound applies)
LOCAL = ""
_trusted: set[str] = set()  # the proxies whose X-Forwarded-For is believed (set once, at start)


def trust_proxy(addresses: list[str] | None) -> None:
    """Believe ``X-Forwarded-For`` from these addresses (the server's ``--trusted-proxy``)."""
    _trusted.clear()
    _trusted.update(a.strip() for a in addresses or [] if a and a.strip())


def client_address() -> str:
    """The client of the request being answered (see the module); :data:`LOCAL` outside one."""
    try:
        from flask import has_request_context, request
    except ImportError:  # pragma: no cover - the app always has flask
        return LOCAL
    if not has_request_context():
        return LOCAL
    addr = str(request.remote_addr or "")[:64]
    if addr in _trusted:
        forwarded = [a.strip() for a in str(request.headers.get("X-Forwarded-For", "")).split(",") if a.strip()]
        if forwarded:
            addr = forwarded[-1][:64]
    return addr or "unknown"
