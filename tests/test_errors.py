"""The error taxonomy: codes, statuses, bodies, retryability, and what messages never say."""

from __future__ import annotations

import pytest

from pd_policy import (
    ERROR_CATALOG,
    ERROR_CODE_HEADER,
    MalformedRequest,
    MissingKvTransferParams,
    MropeOnLanguageModelOnlyDecode,
    PolicyError,
    Request,
    WorkerFailedToStart,
    WorkerStreamError,
    grpc_status_to_http,
)
from pd_policy.tools.outcome import PrefillResult, plan
from pd_policy.tools.scenarios import media_ref_request

CONTRACT = {
    "pd_decode_language_model_only_mrope": 400,
    "pd_decode_language_model_only_media_refs": 400,
    "pd_decode_language_model_only_n_samples": 400,
    "pd_decode_missing_kv_transfer_params": 502,
    "pd_prefill_missing_encoder_output": 502,
    "multimodal_not_supported": 400,
    "pd_invalid_request": 400,
    "pd_media_refused": 400,
    "pd_media_fetch_failed": 422,
    "pd_decode_missing_media_identity": 400,
    # The wire's refusals: the fleet's facts meet the request's shape, before any leg.
    "pd_decode_blind_to_media": 400,
    "pd_handoff_routes_differ": 400,
}


def test_the_catalog_holds_the_contracts_codes_and_statuses() -> None:
    for code, status in CONTRACT.items():
        entry = ERROR_CATALOG[code]
        assert entry.status == status
        assert not entry.retryable
        assert entry.error.code == code
        assert entry.meaning
    assert set(ERROR_CATALOG) == {
        *CONTRACT,
        "prefill_worker_failed_to_start",
        "decode_worker_failed_to_start",
        "encode_worker_failed_to_start",
        "prefill_stream_error",
        "decode_stream_error",
        "encode_stream_error",
        "no_decode_worker_available",
        "pd_invalid_configuration",
        "pd_media_unreachable",
        "no_prefill_worker_available",
        "no_encode_worker_available",
        "pd_unauthorized",
        "pd_forbidden",
        "pd_body_too_large",
        "pd_client_timeout",
        "pd_request_timeout",
        "pd_router_owned_field",
        "pd_too_many_media_items",
        "pd_too_many_parts",
        "pd_overloaded",
        # A handoff past the prefill's lease on its KV: not relayed, tried again.
        "pd_kv_lease_expired",
    }
    assert ERROR_CATALOG["pd_kv_lease_expired"].status == 502
    assert ERROR_CATALOG["pd_kv_lease_expired"].retryable
    # An admin route refused is refused for every caller without an admin key, anonymous or not.
    assert ERROR_CATALOG["pd_forbidden"].status == 403
    assert not ERROR_CATALOG["pd_forbidden"].retryable
    assert ERROR_CATALOG["pd_invalid_configuration"].status == 500
    assert not ERROR_CATALOG["pd_invalid_configuration"].retryable
    assert ERROR_CATALOG["no_decode_worker_available"].status == 503
    assert ERROR_CATALOG["no_decode_worker_available"].retryable
    # A media host that did not answer may answer later; nothing else about media will.
    assert ERROR_CATALOG["pd_media_unreachable"].status == 504
    assert ERROR_CATALOG["pd_media_unreachable"].retryable


def test_every_leg_a_worker_can_fail_has_its_catalog_rows() -> None:
    for cls in (WorkerFailedToStart, WorkerStreamError):
        for leg in cls.LEGS:
            assert ERROR_CATALOG[cls(leg, "INTERNAL").code].error is cls


def test_every_policy_error_class_is_in_the_catalog() -> None:
    def leaves(cls: type[PolicyError]) -> set[type[PolicyError]]:
        subs = set(cls.__subclasses__())
        return subs.union(*(leaves(s) for s in subs))

    assert leaves(PolicyError) <= {e.error for e in ERROR_CATALOG.values()}


def test_the_body_is_openai_shaped() -> None:
    body = MropeOnLanguageModelOnlyDecode().to_body()
    assert body == {
        "error": {
            "type": "bad_request",
            "code": "pd_decode_language_model_only_mrope",
            "message": MropeOnLanguageModelOnlyDecode.default_message,
            "param": None,
        }
    }
    assert MissingKvTransferParams().to_body()["error"]["type"] == "bad_gateway"
    assert MalformedRequest("x", param="n").to_body()["error"]["param"] == "n"
    assert MropeOnLanguageModelOnlyDecode().headers() == {
        ERROR_CODE_HEADER: "pd_decode_language_model_only_mrope"
    }
    assert MissingKvTransferParams().error_status_hint == 502


def test_502_is_not_retryable_although_502_usually_is() -> None:
    assert not MissingKvTransferParams().retryable


@pytest.mark.parametrize(
    ("grpc", "http", "retryable"),
    [
        ("INVALID_ARGUMENT", 400, False),
        ("RESOURCE_EXHAUSTED", 429, True),
        ("UNAVAILABLE", 503, True),
        ("DEADLINE_EXCEEDED", 504, True),
        ("INTERNAL", 500, True),
        ("UNKNOWN", 500, True),
    ],
)
def test_worker_failures_map_from_grpc(grpc: str, http: int, retryable: bool) -> None:
    assert grpc_status_to_http(grpc) == http
    exc = WorkerFailedToStart("decode", grpc, "boom")
    assert (exc.status, exc.retryable, exc.code) == (
        http,
        retryable,
        "decode_worker_failed_to_start",
    )
    assert exc.message == "Decode worker failed to start: boom"


def test_a_stream_error_names_its_leg() -> None:
    exc = WorkerStreamError("prefill", "INTERNAL", "engine died")
    assert (exc.code, exc.status, exc.message) == (
        "prefill_stream_error",
        500,
        "Prefill stream failed: engine died",
    )


def test_a_sidecar_timeout_is_not_retried() -> None:
    assert not WorkerFailedToStart("prefill", "UNAVAILABLE", "sidecar_timeout after 30s").retryable
    with pytest.raises(ValueError, match="leg"):
        WorkerFailedToStart("render", "INTERNAL")


def test_messages_never_echo_urls_or_salts() -> None:
    from pd_policy import VisionSupport, WorkerCapability

    secret_salt = "tenant-acme-secret"
    request = media_ref_request().derive(cache_salt=secret_salt)
    outcome = plan(request, WorkerCapability(VisionSupport.FALSE), PrefillResult.nothing())
    assert outcome.error is not None
    rendered = str(outcome.error.to_body()) + repr(outcome.error)
    assert "token=secret" not in rendered
    assert "media.example" not in rendered
    assert secret_salt not in rendered
    with pytest.raises(MalformedRequest) as bad:
        Request("r", input_ids=(1,), kv_transfer_params='{"secret": ')
    assert "secret" not in bad.value.message
