"""No policy error and no repr shows a secret the request carried, whatever the request.

Secrets are planted where a gateway's tenants put them: the cache salt, the media URLs,
the content hashes, the KV parameters (engine ids, hosts) and the legacy host, on the
request and on what the prefill returned.
"""

from __future__ import annotations

import json

import attrs
from hypothesis import given

from fuzzing import counted, fuzz
from pd_policy import (
    KvConnectorMode,
    LegacyKvParams,
    MediaRef,
    PolicyError,
    Request,
    WorkerCapability,
    build_decode_leg,
    ensure_kv_handoff,
    ensure_language_model_only_leg,
    relay_kv,
)
from pd_policy.tools.outcome import PrefillResult, plan
from strategies import decision_cases, handoffs, note

#: A marker no message or repr could hold by chance.
MARK = "Zq7sEcReT"
KV = json.dumps({"remote_engine_id": MARK + "e", "remote_host": MARK + "h", "transfer_id": MARK})


def planted(request: Request) -> Request:
    """``request`` with a secret in every field that may hold one."""
    batches = tuple(
        attrs.evolve(b, mm_hashes=tuple(f"{MARK}{i}{h}" for i, h in enumerate(b.mm_hashes)))
        for b in request.batches
    )
    refs = tuple(MediaRef(r.modality, f"https://{MARK}.example/a.png") for r in request.media_refs)
    return request.derive(
        batches=batches, media_refs=refs, cache_salt=MARK + (request.cache_salt or ""),
        kv_transfer_params=KV if request.kv_transfer_params is not None else None,
        kv_legacy=LegacyKvParams(MARK, 7000) if request.kv_legacy is not None else None,
    )  # fmt: skip


def shown(exc: PolicyError) -> str:
    return " ".join([str(exc), repr(exc), repr(exc.args), json.dumps(exc.to_body())])


@fuzz
@given(handoffs())
@counted
def test_no_error_or_repr_shows_a_secret(
    example: tuple[Request, WorkerCapability, PrefillResult],
) -> None:
    drawn, worker, prefill = example
    request = planted(drawn)
    note(decision_cases(request, worker))
    returned = PrefillResult(
        KV if prefill.kv_transfer_params is not None else None,
        LegacyKvParams(MARK, 7001) if prefill.kv_legacy is not None else None,
    )
    assert MARK not in repr(request) + repr(returned) + repr(worker)
    assert MARK not in repr(plan(request, worker, returned))
    try:
        form, leg = build_decode_leg(request, worker)
        assert MARK not in repr(leg)
        leg = relay_kv(leg, returned.kv_transfer_params, returned.kv_legacy)
        assert MARK not in repr(leg)
        ensure_kv_handoff(request, form, leg, KvConnectorMode.NIXL)
        # A guard refusing what it should not is another test's; here only what it says.
        ensure_language_model_only_leg(leg)
    except PolicyError as exc:
        assert MARK not in shown(exc)
