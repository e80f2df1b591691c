"""No router-owned field a caller sets ever reaches a worker, whatever the request and router.

Generated requests (text and media, every decode form, n of 0..3) with the caller's own KV
handoff (either wire form, with a marker value, an empty text, or appended again on the
wire) and its own request id, sent through every gRPC router (on messages, on bytes, in a
fleet) to stand-in engines that record every leg they receive: a request that sets a
refused field is refused with ``pd_router_owned_field`` before any leg, and no leg of any
other carries the caller's id or a byte of the caller's handoff.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from typing import Any

import attrs
from engines import (
    Engine,
    FullVisionDecodeEngine,
    LanguageModelOnlyDecodeEngine,
    PrefillEngine,
    serve_address,
)
from hypothesis import event, given
from hypothesis import strategies as st
from proto_strategies import protos

import grpc
from pd_policy import (
    DecodeCandidate,
    PolicyError,
    RouterOwnedField,
    VisionSupport,
    WorkerCapability,
)
from pd_policy_grpc import SequentialPd
from pd_policy_grpc.fleet import FleetPd, describe_worker
from pd_policy_grpc.raw import SequentialPdBytes
from pd_policy_grpc.raw.protowire import length_prefix
from pd_policy_grpc.wire import pb

MARKER = "attacker.example"
_JSON = pb.GenerateRequest.DESCRIPTOR.fields_by_name["kv_transfer_params_json"].number
_LEGACY = pb.GenerateRequest.DESCRIPTOR.fields_by_name["kv_transfer_params"].number
ROUTERS = ("message", "bytes", "fleet-message", "fleet-bytes")


def _field(number: int, body: bytes) -> bytes:
    return length_prefix(number, len(body)) + body


_HOSTILE_JSON = f'{{"remote_host": "{MARKER}", "remote_block_ids": [0]}}'.encode()
_HOSTILE_LEGACY = pb.KvTransferParams(remote_host=MARKER, remote_port=1).SerializeToString()
#: What a caller appends to its serialized request: the handoff again, in either form.
_APPENDED = {
    "json": _field(_JSON, _HOSTILE_JSON),
    "legacy": _field(_LEGACY, _HOSTILE_LEGACY),
    "empty json": _field(_JSON, b""),
}


@st.composite
def hostile(draw: st.DrawFn) -> tuple[bytes, str]:
    """A serialized request with the caller's id, and maybe its handoff; and that id."""
    msg = draw(protos())
    caller_id = "caller-" + draw(st.text(max_size=6))
    msg.request_id = caller_id
    if draw(st.booleans()):
        msg.kv_transfer_params_json = _HOSTILE_JSON.decode()
    if draw(st.booleans()):
        msg.kv_transfer_params.remote_host = MARKER
    appended = draw(st.lists(st.sampled_from(sorted(_APPENDED)), max_size=2))
    return msg.SerializeToString() + b"".join(_APPENDED[a] for a in appended), caller_id


@attrs.define
class Rig:
    """The engines, and a router of each kind over them, on one event loop."""

    loop: asyncio.AbstractEventLoop
    prefill: PrefillEngine
    decodes: tuple[Engine, Engine]
    routers: dict[str, Any]

    def received(self) -> list[pb.GenerateRequest]:
        return [r for e in (self.prefill, *self.decodes) for r in e.requests]

    def clear(self) -> None:
        for engine in (self.prefill, *self.decodes):
            engine.requests.clear()
            engine.aborted.clear()


@contextmanager
def rig() -> Iterator[Rig]:
    loop = asyncio.new_event_loop()
    stack = AsyncExitStack()
    prefill = PrefillEngine()
    decodes = (LanguageModelOnlyDecodeEngine(), FullVisionDecodeEngine())

    async def start() -> dict[str, Any]:
        channels = []
        for engine in (prefill, *decodes):
            address = await stack.enter_async_context(serve_address(engine))
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(address))
            channels.append((address, channel))
        candidates = [
            DecodeCandidate(WorkerCapability(VisionSupport.FALSE), channels[1][1]),
            DecodeCandidate(WorkerCapability(VisionSupport.TRUE), channels[2][1]),
        ]
        routers: dict[str, Any] = {
            "message": SequentialPd(channels[0][1], candidates),
            "bytes": SequentialPdBytes(channels[0][1], candidates),
        }
        for kind, pair in (("fleet-message", SequentialPd), ("fleet-bytes", SequentialPdBytes)):
            fleet = FleetPd(router=pair)
            for (address, channel), role in zip(
                channels, ("prefill", "decode", "decode"), strict=True
            ):
                fleet.add(role, await describe_worker(channel, address, role))
            routers[kind] = fleet
        return routers

    try:
        routers = loop.run_until_complete(start())
        yield Rig(loop, prefill, decodes, routers)
        for router in routers.values():
            loop.run_until_complete(router.aclose())
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()


async def _serve(router: Any, kind: str, data: bytes) -> Any:
    request: Any = data if kind.endswith("bytes") else pb.GenerateRequest.FromString(data)
    try:
        return [r async for r in router.generate(request)]
    except PolicyError as exc:
        return exc


def test_no_caller_set_router_field_reaches_any_engine() -> None:
    reached: set[str] = set()
    with rig() as r:

        @given(
            hostile(),
            st.sampled_from(ROUTERS),
            st.sampled_from(["json", "legacy", "nothing"]),
        )
        def check(case: tuple[bytes, str], kind: str, returns: str) -> None:
            data, caller_id = case
            r.clear()
            r.prefill.returns = returns
            sent = pb.GenerateRequest.FromString(data)
            refused = sent.HasField("kv_transfer_params_json") or sent.HasField(
                "kv_transfer_params"
            )
            outcome = r.loop.run_until_complete(_serve(r.routers[kind], kind, data))
            event(f"outcome: {type(outcome).__name__}")
            received = r.received()
            reached.add("refused" if isinstance(outcome, RouterOwnedField) else "other")
            if received and isinstance(outcome, list):
                reached.add("served")
            if refused:
                assert isinstance(outcome, RouterOwnedField), outcome
                assert received == [], "a refused request reached a worker"
            for leg in received:
                assert leg.request_id != caller_id, "the caller's id reached a worker"
                assert MARKER.encode() not in leg.SerializeToString(), "the caller's handoff"

        check()
        # Not vacuous: the examples both refused requests and served others' legs.
        assert {"refused", "served"} <= reached, reached
