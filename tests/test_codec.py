"""The strict JSON codec."""

from __future__ import annotations

from typing import Any

import pytest

from pd_policy import (
    MalformedRequest,
    VisionSupport,
    WorkerCapability,
    request_from_json,
    request_to_json,
    worker_from_json,
    worker_to_json,
)
from pd_policy.tools.scenarios import image_request, media_ref_request, mrope_request


@pytest.mark.parametrize("request_", [image_request(), mrope_request(), media_ref_request()])
def test_round_trip(request_: Any) -> None:
    assert request_from_json(request_to_json(request_)) == request_


def test_a_minimal_request() -> None:
    request = request_from_json({"request_id": "r", "text": "hi"})
    assert request.text == "hi"
    assert request.n == 1


def test_unspecified_modality_means_image() -> None:
    doc = {"request_id": "r", "input_ids": [1], "batches": [{"modality": "unspecified"}]}
    assert request_from_json(doc).batches[0].modality.value == "image"


#: Keys a document may hold that a path cannot show as they are: a line break, a dot, an
#: empty name, a long one, non-ASCII, brackets.
ODD_KEYS = ["\n", "a.b", "", "k" * 500, "\u00e9\u2028", "x[0]"]


def _tensor_doc(name: str) -> dict[str, Any]:
    tensors = {name: {"shape": [1, 3]}}  # no dtype: refused, under the tensor's path
    return {"request_id": "r", "input_ids": [1], "batches": [{"tensors": tensors}]}


@pytest.mark.parametrize("key", ODD_KEYS)
@pytest.mark.parametrize(
    ("read", "doc", "prefix"),
    [
        (worker_from_json, lambda key: {key: None}, ""),
        (request_from_json, _tensor_doc, "batches[0].tensors."),
        (request_from_json,
         lambda key: {"request_id": "r", "input_ids": [1], "batches": [{"flat_keys": {key: 1}}]},
         "batches[0].flat_keys."),
    ],
    ids=["unknown-field", "tensor-name", "flat-key"],
)  # fmt: skip
def test_a_documents_own_key_is_quoted_in_the_path(
    read: Any, doc: Any, prefix: str, key: str
) -> None:
    with pytest.raises(MalformedRequest) as caught:
        read(doc(key))
    param = caught.value.param
    assert param is not None and param.startswith(prefix + '"'), param
    # One short line of printable ASCII, whatever the key holds.
    assert param.isascii() and param.isprintable() and len(param) < 100, param
    assert "\n" not in caught.value.message


@pytest.mark.parametrize(
    ("doc", "param"),
    [
        ({"request_id": "r", "text": "t", "colour": 1}, "colour"),
        ({"text": "t"}, "request_id"),
        ({"request_id": 5, "text": "t"}, "request_id"),
        ({"request_id": "r", "input_ids": [1, "2"]}, "input_ids[1]"),
        ({"request_id": "r", "input_ids": [1, True]}, "input_ids[1]"),
        ({"request_id": "r", "input_ids": [1], "n": 1.5}, "n"),
        ({"request_id": "r", "input_ids": [1], "batches": {}}, "batches"),
        ({"request_id": "r", "input_ids": [1], "batches": [{"x": 1}]}, "batches[0].x"),
        (
            {"request_id": "r", "input_ids": [1], "batches": [{"modality": "smell"}]},
            "batches[0].modality",
        ),
        (
            {"request_id": "r", "input_ids": [1], "batches": [{"mm_hashes": ["a", ""]}]},
            "batches[0].mm_hashes[1]",
        ),
        (
            {
                "request_id": "r",
                "input_ids": [1],
                "batches": [{"tensors": {"image_grid_thw": {"shape": [1, 3]}}}],
            },
            "batches[0].tensors.image_grid_thw.dtype",
        ),
        (
            {
                "request_id": "r",
                "input_ids": [1],
                "batches": [
                    {"tensors": {"g": {"shape": [-1], "dtype": "int64"}}},
                ],
            },
            "batches[0].tensors.g.shape",
        ),
        (
            {
                "request_id": "r",
                "input_ids": [1],
                "batches": [{"placeholders": [{"offset": 0, "length": 5}], "mm_hashes": ["h"]}],
            },
            "batches[0].placeholders[0]",
        ),
        ({"request_id": "r", "input_ids": [1], "kv_transfer_params": "{}"}, "kv_transfer_params"),
        (
            {"request_id": "r", "input_ids": [1], "media_refs": [{"modality": "image"}]},
            "media_refs[0].url",
        ),
        (
            {
                "request_id": "r",
                "input_ids": [1],
                "kv_transfer_params_legacy": {"remote_host": "h", "remote_port": -1},
            },
            "kv_transfer_params_legacy.remote_port",
        ),
        ([], None),
    ],
)
def test_strict_decoding_names_the_field(doc: object, param: str | None) -> None:
    with pytest.raises(MalformedRequest) as exc:
        request_from_json(doc)
    assert exc.value.param == param
    assert exc.value.status == 400


def test_workers() -> None:
    assert worker_from_json({}) == WorkerCapability()
    lm_only = worker_from_json({"supports_vision": False})
    assert lm_only.language_model_only
    assert worker_from_json(worker_to_json(lm_only)) == lm_only
    full = WorkerCapability(VisionSupport.TRUE, "inprocess", ("https",))
    assert worker_from_json(worker_to_json(full)) == full
    with pytest.raises(MalformedRequest) as exc:
        worker_from_json({"supports_vision": "false"})
    assert exc.value.param == "supports_vision"
    with pytest.raises(MalformedRequest) as exc:
        worker_from_json({"gpu": True})
    assert exc.value.param == "gpu"
