"""A KV handoff is a handoff only when it has its connector's fields: ``{}``, or a handoff
missing any one required field, is the 502 on a stripped multimodal leg, per contract."""

from __future__ import annotations

import json
from typing import Any, Final

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd_policy import (
    REQUIRED_KV_FIELDS,
    DecodeForm,
    KvConnectorMode,
    MissingKvTransferParams,
    check_kv_handoff,
    ensure_kv_handoff,
    missing_kv_fields,
    relay_kv,
)
from pd_policy.tools.scenarios import image_request, text_request

#: What vLLM 0.32's NixlConnector returns (tests/vllm/http/test_http_nixl_live.py).
_NIXL: Final[dict[str, Any]] = {
    "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e0",
    "remote_block_ids": [[3, 4]], "remote_host": "10.1.2.3", "remote_port": 5600,
    "remote_request_id": "r", "tp_size": 1, "dcp_size": 1, "pp_size": 1,
    "remote_num_tokens": 40, "remote_blocks_expiry_time": None, "transfer_mode": "pull",
    "remote_prefill_cached_tokens": 0,
}  # fmt: skip
#: One complete handoff per contract, as each connector returns (or the router mints) it.
COMPLETE: Final[dict[KvConnectorMode, dict[str, Any]]] = {
    KvConnectorMode.NIXL: _NIXL,
    KvConnectorMode.NIXL_PUSH: {**_NIXL, "transfer_mode": "push"},
    KvConnectorMode.TRANSFER: {
        "do_remote_prefill": True, "do_remote_decode": False, "transfer_id": "xfer-9",
        "num_tokens": 40, "prompt_digest": "d", "mm_hashes": ["h"],
    },
    KvConnectorMode.MOONCAKE: {
        "do_remote_prefill": True, "do_remote_decode": False, "transfer_id": "xfer-9",
        "remote_engine_id": "e0", "remote_bootstrap_addr": "http://[fd00::1]:8998",
    },
    KvConnectorMode.PASSTHROUGH: {"lmcache_key": "k"},
}  # fmt: skip
STRIPPED: Final = (DecodeForm.TEXT_PLUS_HASHES, DecodeForm.MROPE_METADATA)
SECRET: Final = "10.1.2.3"

modes = st.sampled_from(list(KvConnectorMode))
#: Values that name nothing: a field holding one is missing.
empties: st.SearchStrategy[object] = st.sampled_from([None, "", [], {}])
#: Values that name something (never ``True`` only: a flag field needs exactly ``true``).
values = st.one_of(
    st.text(min_size=1, max_size=6), st.integers(0, 9), st.lists(st.integers(0, 9), min_size=1)
)


def fires(form: DecodeForm, params: Any, mode: KvConnectorMode, *, mm: bool = True) -> bool:
    try:
        check_kv_handoff(form, has_mm_inputs=mm, kv_transfer_params=params, kv_legacy=None,
                         mode=mode)  # fmt: skip
    except MissingKvTransferParams as exc:
        assert (exc.status, exc.retryable, exc.code) == (
            502, False, "pd_decode_missing_kv_transfer_params",
        )  # fmt: skip
        return True
    return False


def test_every_contract_names_its_fields() -> None:
    assert set(REQUIRED_KV_FIELDS) == set(KvConnectorMode)
    nixl = REQUIRED_KV_FIELDS[KvConnectorMode.NIXL]
    assert {"remote_engine_id", "remote_block_ids", "remote_host", "remote_port"} <= set(nixl)
    assert "transfer_id" in REQUIRED_KV_FIELDS[KvConnectorMode.TRANSFER]
    assert REQUIRED_KV_FIELDS[KvConnectorMode.PASSTHROUGH] == ()


@pytest.mark.parametrize("mode", list(KvConnectorMode))
@pytest.mark.parametrize("form", STRIPPED)
def test_an_empty_object_is_no_handoff(mode: KvConnectorMode, form: DecodeForm) -> None:
    assert fires(form, {}, mode)
    assert fires(form, "{}", mode)  # the wire's text form
    assert fires(form, None, mode)  # nothing at all: the seed's message
    assert not fires(form, COMPLETE[mode], mode)
    assert not fires(form, json.dumps(COMPLETE[mode]), mode)


@pytest.mark.parametrize("mode", list(KvConnectorMode))
def test_text_legs_and_vision_legs_keep_the_recompute_fallback(mode: KvConnectorMode) -> None:
    assert not fires(DecodeForm.TEXT_PLUS_HASHES, {}, mode, mm=False)
    for form in (DecodeForm.IDENTITY_ONLY, DecodeForm.FULL):
        assert not fires(form, {}, mode)


@given(modes, st.data())
def test_a_handoff_missing_any_one_required_field_is_the_502(
    mode: KvConnectorMode, data: st.DataObject
) -> None:
    complete = COMPLETE[mode]
    for field in REQUIRED_KV_FIELDS[mode]:
        dropped = {k: v for k, v in complete.items() if k != field}
        emptied = {**complete, field: data.draw(empties)}
        for broken in (dropped, emptied):
            for form in STRIPPED:
                assert fires(form, broken, mode), field
            assert missing_kv_fields(mode, broken) == (field,)
    assert missing_kv_fields(mode, complete) == ()


@given(modes, st.dictionaries(st.text(max_size=12), values, max_size=4))
def test_a_complete_handoff_serves_whatever_else_it_carries(
    mode: KvConnectorMode, extra: dict[str, Any]
) -> None:
    # A connector returns more than the router needs (newer vLLM adds keys); extras
    # never break a handoff, and never replace a required field with an empty one.
    params = {**extra, **COMPLETE[mode]}
    assert missing_kv_fields(mode, params) == ()
    assert not fires(DecodeForm.TEXT_PLUS_HASHES, params, mode)


@given(st.dictionaries(st.text(max_size=12), empties, max_size=4))
def test_passthrough_needs_one_field_with_a_value(nothing: dict[str, Any]) -> None:
    assert fires(DecodeForm.TEXT_PLUS_HASHES, nothing, KvConnectorMode.PASSTHROUGH)
    assert not fires(DecodeForm.TEXT_PLUS_HASHES, {**nothing, "k": 1}, KvConnectorMode.PASSTHROUGH)


@pytest.mark.parametrize("flag", [False, None, 1, "true"])
@pytest.mark.parametrize(
    "mode", [m for m in KvConnectorMode if m is not KvConnectorMode.PASSTHROUGH]
)
def test_do_remote_prefill_counts_only_when_true(mode: KvConnectorMode, flag: object) -> None:
    # False tells the decode connector to load nothing: it recomputes image-blind.
    assert fires(DecodeForm.TEXT_PLUS_HASHES, {**COMPLETE[mode], "do_remote_prefill": flag}, mode)


@pytest.mark.parametrize("text", ["[1]", "not json", '{"a": 1, "a": 2}', "null"])
def test_text_that_is_no_object_names_no_transfer(text: str) -> None:
    for mode in KvConnectorMode:
        assert fires(DecodeForm.TEXT_PLUS_HASHES, text, mode)


def test_the_legacy_pair_is_a_handoff_only_where_it_can_find_kv() -> None:
    def legacy_fires(mode: KvConnectorMode, pair: tuple[str, int]) -> bool:
        try:
            check_kv_handoff(DecodeForm.TEXT_PLUS_HASHES, has_mm_inputs=True,
                             kv_transfer_params=None, kv_legacy=pair, mode=mode)  # fmt: skip
        except MissingKvTransferParams:
            return True
        return False

    for mode in (KvConnectorMode.MOONCAKE, KvConnectorMode.PASSTHROUGH):
        assert not legacy_fires(mode, ("p0", 7000))
        assert legacy_fires(mode, ("", 7000)) and legacy_fires(mode, ("p0", 0))
    # NIXL and the TransferConnector find KV by engine and blocks, or by transfer id.
    assert legacy_fires(KvConnectorMode.NIXL, ("p0", 7000))
    assert legacy_fires(KvConnectorMode.TRANSFER, ("p0", 7000))


def test_the_message_names_the_missing_fields_and_no_value() -> None:
    leg_params = {k: v for k, v in COMPLETE[KvConnectorMode.NIXL].items() if k != "remote_port"}
    request = image_request()
    leg = relay_kv(request, leg_params)
    with pytest.raises(MissingKvTransferParams) as caught:
        ensure_kv_handoff(request, DecodeForm.TEXT_PLUS_HASHES, leg, KvConnectorMode.NIXL)
    message = caught.value.message
    assert "remote_port" in message and "nixl" in message
    assert "remote_host" not in message  # present: not named
    assert SECRET not in message and "e0" not in message
    assert SECRET not in json.dumps(caught.value.to_body())


def test_the_core_check_reads_the_leg_the_relay_made() -> None:
    text = text_request()
    ensure_kv_handoff(text, DecodeForm.TEXT_PLUS_HASHES, relay_kv(text, {}), KvConnectorMode.NIXL)
    request = image_request()
    with pytest.raises(MissingKvTransferParams):
        ensure_kv_handoff(
            request, DecodeForm.TEXT_PLUS_HASHES, relay_kv(request, {}), KvConnectorMode.NIXL
        )
    complete = relay_kv(request, COMPLETE[KvConnectorMode.NIXL])
    ensure_kv_handoff(request, DecodeForm.TEXT_PLUS_HASHES, complete, KvConnectorMode.NIXL)
