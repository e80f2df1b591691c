"""Construction-time validation: bad input is a typed 400 naming the field, never a KeyError."""

from __future__ import annotations

import attrs
import pytest

from pd_policy import (
    LegacyKvParams,
    MalformedRequest,
    MediaRef,
    Modality,
    MultimodalBatch,
    PayloadLocation,
    PlaceholderRange,
    Request,
    TensorDescriptor,
    VisionSupport,
    WorkerCapability,
)


def bad(param: str | None) -> pytest.RaisesExc[MalformedRequest]:
    return pytest.raises(MalformedRequest, check=lambda e: e.param == param and e.status == 400)


def test_types_are_frozen() -> None:
    request = Request("r", input_ids=(1,))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        request.n = 2  # type: ignore[misc]


def test_placeholder_past_the_ids_is_malformed() -> None:
    batch = MultimodalBatch(placeholders=(PlaceholderRange(2, 4),), mm_hashes=("h",))
    with bad("batches[0].placeholders[0]"):
        Request("r", input_ids=(1, 2, 3), batches=(batch,))
    Request("r", input_ids=(1, 2, 3, 4, 5, 6), batches=(batch,))


def test_placeholders_need_tokenized_input() -> None:
    batch = MultimodalBatch(placeholders=(PlaceholderRange(0, 1),), mm_hashes=("h",))
    with bad("batches[0].placeholders[0]"):
        Request("r", text="hello", batches=(batch,))


def test_exactly_one_input() -> None:
    with bad("input_ids"):
        Request("r")
    with bad("input_ids"):
        Request("r", input_ids=(1,), text="x")


def test_media_refs_cannot_ride_with_batches_or_text() -> None:
    ref = MediaRef(Modality.IMAGE, "https://x/y.png")
    with bad("media_refs"):
        Request("r", input_ids=(1,), media_refs=(ref,), batches=(MultimodalBatch(),))
    with bad("media_refs"):
        Request("r", text="t", media_refs=(ref,))


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"input_ids": (1, -2)}, "input_ids"),
        ({"input_ids": (1, True)}, "input_ids"),
        ({"input_ids": "123"}, "input_ids"),
        ({"input_ids": (1,), "n": -1}, "n"),
        ({"input_ids": (1,), "kv_transfer_params": "[1, 2]"}, "kv_transfer_params"),
        ({"input_ids": (1,), "kv_transfer_params": "{not json"}, "kv_transfer_params"),
        ({"input_ids": (1,), "kv_transfer_params": ""}, "kv_transfer_params"),
        ({"input_ids": (1,), "kv_transfer_params": {"x": object()}}, "kv_transfer_params"),
        ({"input_ids": (1,), "batches": ({"modality": "image"},)}, "batches[0]"),
    ],
)
def test_ill_typed_request_fields(kwargs: dict[str, object], param: str) -> None:
    with bad(param):
        Request("r", **kwargs)  # type: ignore[arg-type]


def test_n_zero_means_one() -> None:
    assert Request("r", input_ids=(), n=0).n == 1


def test_kv_params_text_is_kept_verbatim() -> None:
    text = '{ "b": 1,  "a": [true] }'
    assert Request("r", input_ids=(), kv_transfer_params=text).kv_transfer_params == text
    as_map = Request("r", input_ids=(), kv_transfer_params={"b": 1})
    assert as_map.kv_transfer_params_dict() == {"b": 1}


@pytest.mark.parametrize(
    ("make", "param"),
    [
        (lambda: MultimodalBatch(mm_hashes=("a", "")), "mm_hashes[1]"),
        (lambda: MultimodalBatch(mm_hashes="abc"), "mm_hashes"),
        (
            lambda: MultimodalBatch(placeholders=(PlaceholderRange(0, 1),), mm_hashes=("a", "b")),
            "mm_hashes",
        ),
        (
            lambda: MultimodalBatch(
                tensors=(TensorDescriptor("g", (), "f"), TensorDescriptor("g", (1,), "f"))
            ),
            "tensors",
        ),
        (lambda: MultimodalBatch(pixel_values=TensorDescriptor("x", (), "f")), "pixel_values"),
        (lambda: MultimodalBatch(im_token_id=-1), "im_token_id"),
        (lambda: MultimodalBatch(flat_keys={"a": 1}), "flat_keys"),
        (lambda: PlaceholderRange(0, 0), "length"),
        (lambda: PlaceholderRange(-1, 2), "offset"),
        (lambda: TensorDescriptor("", (1,), "f"), "name"),
        (lambda: TensorDescriptor("t", (-1,), "f"), "shape"),
        (lambda: TensorDescriptor("t", (1,), "f", PayloadLocation.NONE, 8), "nbytes"),
        (lambda: MediaRef(Modality.IMAGE, ""), "url"),
        (lambda: LegacyKvParams("h", 70000), "remote_port"),
        (lambda: WorkerCapability(mm_processor=3), "mm_processor"),  # type: ignore[arg-type]
        (lambda: WorkerCapability(mm_media_ref_schemes="https"), "mm_media_ref_schemes"),
    ],
)
def test_ill_typed_parts(make: object, param: str) -> None:
    with bad(param):
        make()  # type: ignore[operator]


def test_batch_tensors_are_kept_in_name_order() -> None:
    a, b = TensorDescriptor("a", (), "f"), TensorDescriptor("b", (), "f")
    assert MultimodalBatch(tensors=(b, a)) == MultimodalBatch(tensors={"a": a, "b": b})
    assert MultimodalBatch(tensors=(b, a)).tensor("b") is b
    assert MultimodalBatch().tensor("b") is None


def test_secrets_stay_out_of_reprs() -> None:
    ref = MediaRef(Modality.IMAGE, "https://user:pw@host/x.png")
    request = Request("r", input_ids=(1,), media_refs=(ref,), cache_salt="tenant-acme")
    assert "pw@host" not in repr(request)
    assert "tenant-acme" not in repr(request)
    assert ref.scheme == "https"


def test_worker_from_labels_is_tri_state() -> None:
    assert WorkerCapability.from_labels({}).supports_vision is VisionSupport.UNKNOWN
    assert WorkerCapability.from_labels({"supports_vision": "false"}).language_model_only
    assert not WorkerCapability.from_labels({"supports_vision": "False"}).language_model_only
    worker = WorkerCapability.from_labels(
        {"supports_vision": "true", "mm_processor": "redis", "mm_media_ref_schemes": "https, S3"}
    )
    assert worker == WorkerCapability(VisionSupport.TRUE, "redis", ("https", "s3"))
    assert worker.accepts_media_refs
    assert WorkerCapability.from_labels(worker.to_labels()) == worker
    unknown = WorkerCapability()
    assert WorkerCapability.from_labels(unknown.to_labels()) == unknown
