"""A server process given a port another process took first is started again on another,
a bounded number of times; one whose port is fixed (a member restarted where its peers
know it) fails instead. The server here is Python's own ``http.server``: it exits with
``OSError: [Errno 98] Address already in use``, as ``vllm serve`` and the proxy do."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import servers
from servers import REBINDS, Server, candidate_ports, running


def _answers(server: Server) -> bool:
    with urllib.request.urlopen(server.url + "/", timeout=2) as response:
        return bool(response.status == 200)


def http_server(root: Path, ports: tuple[int, ...], *, fixed: bool = False) -> Server:
    def command(ports: tuple[int, ...]) -> list[str]:
        return ["-m", "http.server", str(ports[0]), "--bind", "127.0.0.1", "-d", str(root)]

    return Server("http", command, root / "http.log", _answers, ports=ports, fixed=fixed)


@contextmanager
def taken() -> Iterator[int]:
    """A port this process holds (bound, not listening: nothing answers on it)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def test_a_server_whose_port_was_taken_starts_again_on_another(tmp_path: Path) -> None:
    with taken() as port:
        server = http_server(tmp_path, (port,))
        with running([server]):
            assert server.rebound == 1 and server.port != port and _answers(server)
    log = (tmp_path / "http.log").read_text()
    assert "Address already in use" in log and f"was taken: started on ({server.port},)" in log


def test_a_server_whose_ports_are_fixed_fails_when_one_is_taken(tmp_path: Path) -> None:
    with taken() as port:
        server = http_server(tmp_path, (port,), fixed=True)
        server.start()
        with pytest.raises(RuntimeError, match="Address already in use"):
            server.wait_ready(time.monotonic() + 60)
    assert server.rebound == 0


def test_a_server_is_started_again_at_most_rebinds_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with taken() as port:
        monkeypatch.setattr(servers, "candidate_ports", lambda count: (port,) * count)
        server = http_server(tmp_path, (port,))
        server.start()
        with pytest.raises(RuntimeError, match="Address already in use"):
            server.wait_ready(time.monotonic() + 120)
    assert server.rebound == REBINDS


def test_candidate_ports_are_distinct_unbound_and_outside_the_ephemeral_range() -> None:
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = candidate_ports(20)
    assert len(set(ports)) == 20
    assert all(not low <= p <= high for p in ports)
    for port in ports:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))  # raises if it was bound
