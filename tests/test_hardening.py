"""Bad input to the core's types: a one-line typed error naming the field, never its value;
integers bounded to the wire; strict JSON; reprs that hide what errors hide."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd_policy import (
    EngineFacts,
    InvalidConfiguration,
    KvConnectorMode,
    LegacyKvParams,
    MalformedRequest,
    MediaRef,
    MmInputProbe,
    Modality,
    MultimodalBatch,
    PayloadLocation,
    PlaceholderRange,
    PolicyError,
    PrefillKv,
    Request,
    Support,
    TensorDescriptor,
    WorkerCapability,
    plan_kv_handoff,
)
from pd_policy.fields import UINT32_MAX
from pd_policy.jsontext import loads_strict

SECRET = "tenant-secret-9f2c"  # a value no error may echo


def _ids(**kw: Any) -> Request:
    return Request("r", input_ids=(1, 2, 3), **kw)


ILL_TYPED: list[tuple[str, Callable[[], object], str]] = [
    ("cache_salt", lambda: _ids(cache_salt=b"tenant-secret-9f2c"), "cache_salt"),
    ("text", lambda: Request("r", text=["tenant-secret-9f2c"]), "text"),  # type: ignore[arg-type]
    ("request_id", lambda: Request(7, text="x"), "request_id"),  # type: ignore[arg-type]
    ("legacy host", lambda: LegacyKvParams(("tenant-secret-9f2c",), 1), "remote_host"),  # type: ignore[arg-type]
    ("kv_legacy", lambda: _ids(kv_legacy={"remote_host": SECRET}), "kv_legacy"),
    ("dtype", lambda: TensorDescriptor("g", (1, 3), 64), "dtype"),  # type: ignore[arg-type]
    ("location", lambda: TensorDescriptor("g", (1,), "i8", "inline"), "location"),  # type: ignore[arg-type]
    ("modality", lambda: MultimodalBatch(modality="image"), "modality"),  # type: ignore[arg-type]
    ("pixel_values", lambda: MultimodalBatch(pixel_values=SECRET), "pixel_values"),  # type: ignore[arg-type]
    ("encoder_input_key", lambda: MultimodalBatch(encoder_input_key=1), "encoder_input_key"),  # type: ignore[arg-type]
    ("media ref modality", lambda: MediaRef("image", SECRET), "modality"),  # type: ignore[arg-type]
    ("supports_vision", lambda: WorkerCapability("false"), "supports_vision"),  # type: ignore[arg-type]
    ("metadata", lambda: WorkerCapability(accepts_mm_metadata=True), "accepts_mm_metadata"),  # type: ignore[arg-type]
    ("facts bool", lambda: EngineFacts("y", MmInputProbe.SUPPORTED), "is_multimodal_model"),  # type: ignore[arg-type]
    ("facts probe", lambda: EngineFacts(True, "supported"), "mm_input_probe"),  # type: ignore[arg-type]
    ("n as bool", lambda: _ids(n=True), "n"),
    ("id as bool", lambda: Request("r", input_ids=(1, True)), "input_ids"),
    ("id as float", lambda: Request("r", input_ids=(1, 2.0)), "input_ids"),
    ("offset as str", lambda: PlaceholderRange("1", 2), "offset"),  # type: ignore[arg-type]
]  # fmt: skip


@pytest.mark.parametrize(("case", "build", "param"), ILL_TYPED, ids=[c[0] for c in ILL_TYPED])
def test_every_ill_typed_field_is_a_malformed_request_naming_it(
    case: str, build: Callable[[], object], param: str
) -> None:
    with pytest.raises(MalformedRequest) as caught:
        build()
    assert caught.value.param == param
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)
    assert "\n" not in caught.value.message


def test_a_prefill_workers_configuration_is_an_invalid_configuration() -> None:
    builds: list[Callable[[], object]] = [
        lambda: PrefillKv("mooncake"),  # type: ignore[arg-type]
        lambda: PrefillKv(KvConnectorMode.MOONCAKE, engine_id=3, bootstrap_host="h"),
        lambda: PrefillKv(KvConnectorMode.MOONCAKE, bootstrap_host=(SECRET,)),
    ]
    for build in builds:
        with pytest.raises(InvalidConfiguration) as caught:
            build()
        assert SECRET not in str(caught.value)


BOUNDED: list[tuple[str, Callable[[int], object], str]] = [
    ("n", lambda v: _ids(n=v), "n"),
    ("input_ids", lambda v: Request("r", input_ids=(1, v)), "input_ids"),
    ("offset", lambda v: PlaceholderRange(v, 1), "offset"),
    ("length", lambda v: PlaceholderRange(0, v), "length"),
    ("shape", lambda v: TensorDescriptor("g", (1, v), "int64"), "shape"),
    ("im_token_id", lambda v: MultimodalBatch(im_token_id=v), "im_token_id"),
]


@pytest.mark.parametrize(("name", "build", "param"), BOUNDED, ids=[b[0] for b in BOUNDED])
def test_wire_integers_are_bounded_to_uint32(
    name: str, build: Callable[[int], object], param: str
) -> None:
    build(UINT32_MAX)  # the largest the wire carries is taken
    for bad in (UINT32_MAX + 1, 2**64, -1):
        with pytest.raises(MalformedRequest) as caught:
            build(bad)
        assert caught.value.param == param


@pytest.mark.parametrize("value", ["false", "true", "", 0, 1, "False", [], b"false"])
def test_from_bool_takes_only_bools_and_none(value: object) -> None:
    # "false" is truthy: read as TRUE it would make a language-model-only worker vision-capable.
    with pytest.raises(MalformedRequest):
        Support.from_bool(value)  # type: ignore[arg-type]
    assert Support.from_bool(None) is Support.UNKNOWN
    assert Support.from_bool(False) is Support.FALSE and Support.from_bool(True) is Support.TRUE


@pytest.mark.parametrize(
    "labels", [None, "supports_vision=false", [("supports_vision", "false")],
               {"supports_vision": False}, {1: "false"}, {"mm_processor": None}],
)  # fmt: skip
def test_from_labels_takes_only_a_mapping_of_strings(labels: object) -> None:
    with pytest.raises(MalformedRequest):
        WorkerCapability.from_labels(labels)  # type: ignore[arg-type]
    assert WorkerCapability.from_labels({"supports_vision": "false"}).language_model_only


@pytest.mark.parametrize(
    ("text", "says"),
    [('{"a": 1, "a": 2}', "twice"), ('{"x": {"a": 1, "a": 1}}', "twice"), ("[NaN]", "NaN"),
     ("[Infinity]", "NaN"), ("[1e400]", "out of range"), ("[" * 100_000, "nested"),
     ('{"a" 1}', "not JSON")],
)  # fmt: skip
def test_strict_json_refuses_what_two_readers_could_read_two_ways(text: str, says: str) -> None:
    with pytest.raises(MalformedRequest) as caught:
        loads_strict(text)
    assert says in caught.value.message


def test_kv_parameters_given_as_text_are_strict_json() -> None:
    with pytest.raises(MalformedRequest) as caught:
        _ids(kv_transfer_params='{"transfer_id": "a", "transfer_id": "b"}')
    assert caught.value.param == "kv_transfer_params"
    assert '"a"' not in caught.value.message  # the position, never the content


# A marker no repr could hold by chance, then arbitrary characters.
secrets = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", max_size=12).map(
    lambda t: f"Zq7{t}"
)


@given(salt=secrets, host=secrets, engine=secrets, digest=secrets, url=secrets)
def test_a_repr_shows_none_of_what_an_error_never_echoes(
    salt: str, host: str, engine: str, digest: str, url: str
) -> None:
    batch = MultimodalBatch(mm_hashes=(digest,), placeholders=(PlaceholderRange(0, 1),))
    request = Request(
        "r", input_ids=(1, 2), batches=(batch,), cache_salt=salt,
        kv_transfer_params={"remote_engine_id": engine, "remote_host": host},
        kv_legacy=LegacyKvParams(host, 7000),
    )  # fmt: skip
    refs = Request("q", input_ids=(1,), media_refs=(MediaRef(Modality.IMAGE, url),))
    kv = PrefillKv(KvConnectorMode.MOONCAKE, engine_id=engine, bootstrap_host=host)
    handoff = plan_kv_handoff(kv, n=1, transfer_id=f"xfer-{digest}")
    shown = " ".join(repr(x) for x in (request, refs, kv, handoff, batch))
    for secret in (salt, host, engine, digest, url):
        assert secret not in shown
    assert "<1>" in repr(batch)  # how many hashes, not which


def test_errors_and_reprs_agree_that_a_grid_location_is_not_secret() -> None:
    # What is shown stays useful: the shape of a request, not its identities.
    grid = TensorDescriptor("image_grid_thw", (1, 3), "int64", PayloadLocation.SHM, 24)
    assert "image_grid_thw" in repr(MultimodalBatch(tensors=(grid,)))


def test_every_policy_error_is_one_line() -> None:
    for build, _ in [(b, p) for _, b, p in ILL_TYPED]:
        try:
            build()
        except PolicyError as exc:
            assert len(str(exc).splitlines()) == 1
