"""A free TCP port for a rendezvous (torch.distributed's master port, a Ray node's)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port no socket on this host holds now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
