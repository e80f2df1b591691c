"""Policy errors on the wire: gRPC status and trailing metadata, HTTP, and back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from engines import serve

import grpc
from pd_policy import (
    ERROR_CATALOG,
    MalformedRequest,
    MissingKvTransferParams,
    MropeOnLanguageModelOnlyDecode,
    MultimodalNotSupported,
    PolicyError,
    WorkerFailedToStart,
    WorkerStreamError,
)
from pd_policy_grpc import error_from_rpc, grpc_status, http_error
from pd_policy_grpc.wire import pb, pb_grpc


def test_policy_errors_map_to_grpc_codes() -> None:
    assert grpc_status(MropeOnLanguageModelOnlyDecode()).code is grpc.StatusCode.INVALID_ARGUMENT
    assert grpc_status(MalformedRequest("x")).code is grpc.StatusCode.INVALID_ARGUMENT
    assert grpc_status(MissingKvTransferParams()).code is grpc.StatusCode.FAILED_PRECONDITION
    assert (
        grpc_status(WorkerFailedToStart("decode", "UNAVAILABLE")).code
        is grpc.StatusCode.UNAVAILABLE
    )
    status = grpc_status(MissingKvTransferParams())
    assert dict(status.trailing_metadata) == {
        "x-smg-error-code": "pd_decode_missing_kv_transfer_params",
        "x-pd-http-status": "502",
        "x-pd-retryable": "false",
    }


def test_every_catalog_error_has_a_grpc_status() -> None:
    for entry in ERROR_CATALOG.values():
        error = (
            entry.error("decode", "INTERNAL", "x")
            if issubclass(entry.error, WorkerFailedToStart)
            else entry.error()
        )
        assert grpc_status(error).code is not grpc.StatusCode.OK


def test_http_error() -> None:
    response = http_error(MropeOnLanguageModelOnlyDecode())
    assert response.status == 400
    assert dict(response.headers)["X-SMG-Error-Code"] == "pd_decode_language_model_only_mrope"
    assert json.loads(response.body)["error"]["code"] == "pd_decode_language_model_only_mrope"


class Refusing(pb_grpc.VllmEngineServicer):
    """A worker whose servicer refuses with a policy error, as a decode guard would."""

    def __init__(self, error: PolicyError) -> None:
        self.error = error

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[pb.GenerateResponse]:  # noqa: N802
        if isinstance(self.error, WorkerStreamError):
            yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[1]))
        status = grpc_status(self.error)
        await context.abort(status.code, status.details, status.trailing_metadata)


@pytest.mark.parametrize(
    "error",
    [
        MultimodalNotSupported(),
        MropeOnLanguageModelOnlyDecode(),
        MissingKvTransferParams(),
        WorkerFailedToStart("decode", "RESOURCE_EXHAUSTED", "queue full"),
    ],
)
def test_a_policy_error_crosses_a_grpc_hop_typed(error: PolicyError) -> None:
    async def main() -> PolicyError:
        async with serve(Refusing(error)) as channel:
            stub = pb_grpc.VllmEngineStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                async for _ in stub.Generate(pb.GenerateRequest(request_id="r", text="t")):
                    pass
            return error_from_rpc(exc.value, "decode")

    received = asyncio.run(main())
    assert type(received) is type(error)
    assert (received.code, received.status, received.message) == (
        error.code,
        error.status,
        error.message,
    )


def test_an_error_after_output_is_a_stream_error() -> None:
    async def main() -> PolicyError:
        async with serve(Refusing(WorkerStreamError("decode", "INTERNAL", "died"))) as channel:
            stub = pb_grpc.VllmEngineStub(channel)
            started = False
            try:
                async for _ in stub.Generate(pb.GenerateRequest(request_id="r", text="t")):
                    started = True
            except grpc.aio.AioRpcError as exc:
                return error_from_rpc(exc, "decode", started=started)
            raise AssertionError("no error")

    received = asyncio.run(main())
    assert (received.code, received.status) == ("decode_stream_error", 500)
