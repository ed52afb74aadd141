"""A free TCP port for a server about to start: the router, its runtime API, a replica on this machine."""

from __future__ import annotations

import socket


def free_port(address: str = "127.0.0.1") -> int:
    """A port the kernel gives at ``address`` now (bind to port 0). Asked on the address the server will listen
    on: a port free on 127.0.0.1 may be taken on another interface."""
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]
