"""The post-prefill check on the wire is the core's, for every request, worker and prefill
result: the same decode form, the same relayed leg, the same 502."""

from __future__ import annotations

from hypothesis import given, reject
from proto_strategies import to_proto

import pd_policy
import pd_policy_grpc
from pd_policy import (
    KvConnectorMode,
    MissingKvTransferParams,
    PolicyError,
    Request,
    WorkerCapability,
)
from pd_policy.tools.outcome import PrefillResult
from pd_policy_grpc import request_view
from pd_policy_grpc.wire import pb
from strategies import decision_cases, handoffs, note


def completion(prefill: PrefillResult) -> pb.GenerateComplete:
    """What a prefill engine that returned ``prefill`` sends back."""
    complete = pb.GenerateComplete()
    if prefill.kv_transfer_params is not None:
        complete.kv_transfer_params_json = prefill.kv_transfer_params  # JSON text
    if prefill.kv_legacy is not None:
        complete.kv_transfer_params.SetInParent()  # present even with default values
        complete.kv_transfer_params.remote_host = prefill.kv_legacy.remote_host
        complete.kv_transfer_params.remote_port = prefill.kv_legacy.remote_port
    return complete


def fires(check: object, *args: object) -> bool:
    try:
        check(*args)  # type: ignore[operator]
    except MissingKvTransferParams as exc:
        assert (exc.status, exc.retryable) == (502, False)
        return True
    return False


@given(handoffs())
def test_the_wire_502_is_the_cores(
    example: tuple[Request, WorkerCapability, PrefillResult],
) -> None:
    drawn, worker, prefill = example
    try:
        msg = to_proto(drawn)
    except UnicodeEncodeError:
        reject()  # a lone surrogate: the wire carries UTF-8 only
    # The core's side reads what the wire carries (fabricated payload sizes, no salt).
    request = request_view(msg)
    note(decision_cases(request, worker))
    try:
        form, core_leg = pd_policy.build_decode_leg(request, worker)
    except PolicyError:
        return  # refused before any prefill: the wire builder's refusal is tested elsewhere
    wire_form, wire_leg = pd_policy_grpc.build_decode_leg(msg, worker)
    assert wire_form is form
    core_leg = pd_policy.relay_kv(core_leg, prefill.kv_transfer_params, prefill.kv_legacy)
    wire_leg = pd_policy_grpc.relay_kv(wire_leg, completion(prefill))
    assert request_view(wire_leg) == core_leg
    for mode in KvConnectorMode:
        core = fires(pd_policy.ensure_kv_handoff, request, form, core_leg, mode)
        assert fires(pd_policy_grpc.ensure_kv_handoff, msg, form, wire_leg, mode) == core
