"""The gRPC router under test, on messages or on bytes: one suite proves both.

A test builds its router with [`sequential_pd`][] and drives it as a
``SequentialPd``; under the ``bytes`` mode that is a ``SequentialPdBytes`` fed the
message's serialization, its responses parsed back, so every assertion about
legs, errors and aborts holds of both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, contextmanager
from typing import Any, Final, cast

import grpc
from pd_policy import DecodeCandidate
from pd_policy_grpc import SequentialPd
from pd_policy_grpc.raw import SequentialPdBytes, read_request
from pd_policy_grpc.wire import pb

MODES: Final = ("message", "bytes")
_current = ["message"]


@contextmanager
def mode(name: str) -> Iterator[None]:
    """Build routers of mode ``name`` (``message`` or ``bytes``) within the block."""
    _current.append(name)
    try:
        yield
    finally:
        _current.pop()


class ViaBytes:
    """A ``SequentialPdBytes`` seen through ``SequentialPd``'s interface."""

    def __init__(self, inner: SequentialPdBytes) -> None:
        self.inner = inner

    async def generate(self, request: pb.GenerateRequest) -> AsyncIterator[pb.GenerateResponse]:
        # aclosing: closing this stream closes the router's at once, as a caller's would.
        async with aclosing(self.inner.generate(request.SerializeToString())) as stream:
            async for item in stream:
                yield pb.GenerateResponse.FromString(item)

    def choose(self, request: pb.GenerateRequest) -> DecodeCandidate[grpc.aio.Channel]:
        return self.inner.choose(read_request(request.SerializeToString()))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def sequential_pd(*args: Any, **kwargs: Any) -> SequentialPd:
    """A router of the current mode, built with ``SequentialPd``'s arguments."""
    if _current[-1] == "message":
        return SequentialPd(*args, **kwargs)
    return cast(SequentialPd, ViaBytes(SequentialPdBytes(*args, **kwargs)))
