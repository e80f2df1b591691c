"""A caller's router-owned fields on the gRPC routers: refused, typed, before any worker.

The KV handoff is the router's: a caller's ``kv_transfer_params_json`` (or the legacy
typed ``kv_transfer_params``) on a leg that carries none of the router's (a decode that
runs alone for n>1, a prefill that returned nothing, the legacy pair next to a relayed
JSON handoff) would tell the decode worker where to connect and which blocks to read.
Each router refuses it with ``pd_router_owned_field`` (400) before any call, on messages
and on bytes, alone and in a fleet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest
from engines import (
    Engine,
    FullVisionDecodeEngine,
    LanguageModelOnlyDecodeEngine,
    PrefillEngine,
    serve_address,
)
from proto_strategies import to_proto

import grpc
from pd_policy import ROUTER_FIELDS, RouterOwnedField, VisionSupport, WorkerCapability
from pd_policy.tools.scenarios import image_request, mrope_request, text_request
from pd_policy_grpc import SequentialPd
from pd_policy_grpc.fleet import FleetPd, describe_worker
from pd_policy_grpc.owned import DROPPED, REFUSED, WIRE_FIELDS, check_message, check_numbers
from pd_policy_grpc.raw import SequentialPdBytes
from pd_policy_grpc.status import grpc_status
from pd_policy_grpc.wire import pb

#: What a hostile caller would point a decode worker at.
HOSTILE = '{"do_remote_prefill": true, "remote_host": "attacker.example", "remote_port": 1}'
ROUTERS = ("message", "bytes", "fleet-message", "fleet-bytes")
Body = Callable[[Any, PrefillEngine, Engine], Awaitable[None]]


def run(kind: str, body: Body, *, prefill: PrefillEngine, decode: Engine) -> None:
    """Serve the engines and run ``body`` with a router of ``kind`` over them."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            p_addr = await stack.enter_async_context(serve_address(prefill))
            d_addr = await stack.enter_async_context(serve_address(decode))
            p_channel = await stack.enter_async_context(grpc.aio.insecure_channel(p_addr))
            d_channel = await stack.enter_async_context(grpc.aio.insecure_channel(d_addr))
            router: Any
            if kind.startswith("fleet"):
                pair = SequentialPdBytes if kind.endswith("bytes") else SequentialPd
                router = FleetPd(router=pair)
                router.add("prefill", await describe_worker(p_channel, p_addr, "prefill"))
                router.add("decode", await describe_worker(d_channel, d_addr, "decode"))
            else:
                pair = SequentialPdBytes if kind == "bytes" else SequentialPd
                capability = WorkerCapability(
                    VisionSupport.TRUE if decode.supports_vision else VisionSupport.FALSE
                )
                router = pair(p_channel, d_channel, capability)
            await body(router, prefill, decode)
            await router.aclose()

    asyncio.run(main())


async def collect(router: Any, request: pb.GenerateRequest) -> list[Any]:
    data: Any = request
    if isinstance(router, SequentialPdBytes) or (
        isinstance(router, FleetPd) and router.router is SequentialPdBytes
    ):
        data = request.SerializeToString()
    return [r async for r in router.generate(data)]


def hostile_json(request: pb.GenerateRequest) -> pb.GenerateRequest:
    request.kv_transfer_params_json = HOSTILE
    return request


def empty_json(request: pb.GenerateRequest) -> pb.GenerateRequest:
    request.kv_transfer_params_json = ""
    return request


def hostile_legacy(request: pb.GenerateRequest) -> pb.GenerateRequest:
    request.kv_transfer_params.remote_host = "attacker.example"
    request.kv_transfer_params.remote_port = 1
    return request


# Each form on which today's leg would carry the caller's handoff to a worker.
FORMS: dict[str, tuple[Callable[[], pb.GenerateRequest], str, Callable[[], Engine]]] = {
    # n>1: decode runs alone; nothing of the router's replaces the caller's.
    "n>1 decode-only, json": (
        lambda: hostile_json(to_proto(text_request(n=2))),
        "json",
        LanguageModelOnlyDecodeEngine,
    ),
    # The prefill returned nothing: text keeps the recompute fallback, with the caller's.
    "prefill returned nothing, json": (
        lambda: hostile_json(to_proto(text_request())),
        "nothing",
        LanguageModelOnlyDecodeEngine,
    ),
    # The legacy pair is relayed only when the prefill returns one.
    "legacy pair beside a relayed json": (
        lambda: hostile_legacy(to_proto(text_request())),
        "json",
        LanguageModelOnlyDecodeEngine,
    ),
    # A full-vision decode: the whole request, pixels and the caller's handoff.
    "full form, prefill returned nothing": (
        lambda: hostile_json(to_proto(image_request(n=2))),
        "nothing",
        FullVisionDecodeEngine,
    ),
    # Identity-only on a vision decode (M-RoPE grids ride along).
    "identity-only, legacy": (
        lambda: hostile_legacy(to_proto(mrope_request())),
        "nothing",
        FullVisionDecodeEngine,
    ),
    # Even an empty JSON text is the field: set is set, whatever its value.
    "an empty json text": (
        lambda: empty_json(to_proto(text_request(n=2))),
        "json",
        LanguageModelOnlyDecodeEngine,
    ),
}


@pytest.mark.parametrize("kind", ROUTERS)
@pytest.mark.parametrize("form", list(FORMS))
def test_a_callers_kv_handoff_is_refused_before_any_worker(kind: str, form: str) -> None:
    make, returns, decode = FORMS[form]

    async def body(router: Any, p: PrefillEngine, d: Engine) -> None:
        request = make()
        with pytest.raises(RouterOwnedField) as caught:
            await collect(router, request)
        error = caught.value
        assert (error.status, error.code, error.retryable) == (400, "pd_router_owned_field", False)
        assert error.param in {"kv_transfer_params_json", "kv_transfer_params"}
        assert "attacker" not in error.message  # the value is never echoed
        assert p.requests == [] and d.requests == []  # no worker was called
        status = grpc_status(error)
        assert status.code is grpc.StatusCode.INVALID_ARGUMENT
        assert ("x-smg-error-code", "pd_router_owned_field") in status.trailing_metadata

    run(kind, body, prefill=PrefillEngine(returns=returns), decode=decode())


@pytest.mark.parametrize("kind", ROUTERS)
def test_two_callers_choosing_one_id_run_under_two_ids(kind: str) -> None:
    # Both in flight at once on one prefill (it holds them), then one caller leaves: its
    # abort names its own legs, never the other caller's.
    async def body(router: Any, p: PrefillEngine, d: Engine) -> None:
        p.hold_first.set()
        same = [to_proto(image_request(request_id="same")) for _ in range(2)]
        tasks = [asyncio.ensure_future(collect(router, r)) for r in same]
        async with asyncio.timeout(10):
            while len(p.requests) < 2:
                await asyncio.sleep(0.01)
        ids = [leg.request_id for leg in p.requests]
        assert len(set(ids)) == 2 and "same" not in ids
        tasks[0].cancel()
        with pytest.raises(asyncio.CancelledError):
            await tasks[0]
        p.release.set()
        await tasks[1]
        (aborted,) = p.aborted
        (decode,) = d.requests  # the other one's decode, under its own prefill's id
        assert aborted != decode.request_id and {aborted, decode.request_id} == set(ids)

    run(kind, body, prefill=PrefillEngine(), decode=LanguageModelOnlyDecodeEngine())


def test_every_core_router_field_has_its_row_on_this_wire() -> None:
    # A field the core adds fails here until this wire says how it carries it.
    assert set(WIRE_FIELDS) == set(ROUTER_FIELDS)
    known = pb.GenerateRequest.DESCRIPTOR.fields_by_name
    for field, wire in WIRE_FIELDS.items():
        assert all(name in known for name in wire.names), field.name
        assert wire.why
    assert dict(REFUSED) == {"kv_transfer_params_json": 8, "kv_transfer_params": 6}
    assert dict(DROPPED) == {"request_id": 1}


def test_every_proto_field_that_looks_like_the_routers_has_a_row() -> None:
    # A proto that grows a handoff-like field (an encoder cache's, extension arguments, a
    # cache report) fails here until the table maps it.
    mapped = {name for wire in WIRE_FIELDS.values() for name in wire.names}
    looks = ("transfer", "xargs", "extra_args", "request_id", "ec_", "encoder_cache", "report")
    names = {f.name for f in pb.GenerateRequest.DESCRIPTOR.fields}
    assert {n for n in names if any(word in n for word in looks)} <= mapped


@pytest.mark.parametrize(("name", "number"), REFUSED)
def test_each_refused_field_is_named_on_messages_and_on_bytes(name: str, number: int) -> None:
    msg = to_proto(text_request())
    if name == "kv_transfer_params":
        msg.kv_transfer_params.SetInParent()  # set, though empty
    else:
        setattr(msg, name, "")
    with pytest.raises(RouterOwnedField) as on_message:
        check_message(msg)
    with pytest.raises(RouterOwnedField) as on_bytes:
        check_numbers([1, 2, number, 4])
    assert on_message.value.param == on_bytes.value.param == name
