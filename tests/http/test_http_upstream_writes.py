"""How a leg's request goes to the socket: its head and small parts joined into few writes
(each write is a system call), and a large part written as the very object it is (a view
of the client's buffer, never copied by a join)."""

from __future__ import annotations

import asyncio
from typing import Any

from pd_policy_vllm.http.upstream.connection import Connection


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[Any] = []

    def write(self, data: Any) -> None:
        self.writes.append(data)

    def resume_reading(self) -> None:
        pass


def _sent(head: bytes, parts: list[Any]) -> list[Any]:
    connection, transport = Connection(), _Transport()
    connection.connection_made(transport)
    connection.request(head, parts)
    assert b"".join(bytes(w) for w in transport.writes) == head + b"".join(map(bytes, parts))
    return transport.writes


def test_a_small_request_is_one_write() -> None:
    parts = [b"{", b"x" * 90_000, b"}"]  # a 64 KiB image's base64, between its JSON
    assert len(_sent(b"POST / HTTP/1.1\r\n\r\n", parts)) == 1


def test_a_large_part_is_written_as_it_is_between_its_joined_neighbours() -> None:
    image = memoryview(bytearray(b"i" * 2**20))
    writes = _sent(b"HEAD", [b"{", image, b"}", b"more"])
    assert len(writes) == 3 and writes[1] is image  # never copied by a join
    assert writes[0] == b"HEAD{" and writes[2] == b"}more"


def test_small_parts_past_the_join_size_start_a_write_of_their_own() -> None:
    parts = [b"a" * 200_000, b"b" * 200_000]
    assert [len(w) for w in _sent(b"H", parts)] == [200_001, 200_000]
