"""Local TCP ports for the servers SpecLens starts (SGLang, the dashboard in tests and benches)."""

from __future__ import annotations

import random
import socket


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_port(host: str = "127.0.0.1", low: int = 20000, high: int = 45000) -> int:
    """A free port in [low, high): SGLang 0.5.15 derives more ports from the HTTP port (its gRPC port is
    port + 10000, rejected above 65535), so an OS-chosen ephemeral port (up to 60999) can fail at start."""
    for port in random.Random().sample(range(low, high), 200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {low}-{high} on {host}")
