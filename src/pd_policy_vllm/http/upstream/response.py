"""A worker's answer to a leg, as its caller reads it: its status, then its body, whole or
piece by piece, at the caller's pace (the connection reads its socket no further ahead
than its window)."""

from __future__ import annotations

from .connection import Connection, Head

__all__ = ["Response"]


class Response:
    """A worker's answer on ``connection``: its status, then its body. It is read within
    the block of [`Upstream.post`][pd_policy_vllm.http.upstream.Upstream.post], which
    hands the connection back at the block's end."""

    __slots__ = ("_connection", "status")

    def __init__(self, connection: Connection, head: Head) -> None:
        self._connection = connection
        self.status = head.status

    async def read(self) -> bytes:
        """The whole body (what is left of it)."""
        return await self._connection.read_all()

    def __aiter__(self) -> Response:
        return self

    async def __anext__(self) -> bytes:
        piece = await self._connection.read()
        if not piece:
            raise StopAsyncIteration
        return piece
