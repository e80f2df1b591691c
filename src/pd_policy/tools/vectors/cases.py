"""The ``plan`` operation's conformance cases (decisions, handoffs, legs, salts, malformed
input), then the other operations' (``check_cases`` and the rest)."""

from __future__ import annotations

from typing import Any, Final

from pd_policy.batch import Modality, MultimodalBatch, PlaceholderRange
from pd_policy.codec import worker_to_json
from pd_policy.handoff_fields import REQUIRED_KV_FIELDS
from pd_policy.request import Request
from pd_policy.tensor import PayloadLocation, TensorDescriptor
from pd_policy.tools.scenarios import (
    content_hash,
    image_request,
    media_ref_request,
    mrope_request,
    text_request,
)

from .check_cases import check_cases as _check_cases
from .client_cases import client_cases
from .exchange_cases import exchange_cases
from .fixtures import COMPLETE_HANDOFFS, NIXL, WORKERS, req
from .fleet_cases import fleet_cases
from .media_cases import media_cases
from .wire_cases import wire_cases

__all__ = ["ADVERSARIAL", "WORKERS", "all_cases"]

#: Salts and hashes built to break naive encodings: separators, prefixes, NUL, non-ASCII.
ADVERSARIAL: Final = ("a,b", "a", "b", ",", ":", "mm:", "mm1:", "a\x00b", "é", "日本", "x" * 300)


def grid_of(location: PayloadLocation, name: str = "image_grid_thw") -> TensorDescriptor:
    return TensorDescriptor(
        name, (1, 3), "int64", location, 0 if location is PayloadLocation.NONE else 24
    )


def _handoff_field_cases(add: Any, lm_only: dict[str, Any]) -> None:
    """A handoff is one only with its connector's fields: per contract, the complete one
    serves; ``{}``, and the complete one less any required field, are the 502."""
    image, text = req(image_request()), req(text_request())
    for mode, complete in COMPLETE_HANDOFFS.items():
        m = mode.value
        for name, returned in (("complete", complete), ("empty", {})):
            add(
                f"handoff/image/{name}/{m}/lm_only",
                f"a {name} handoff under {m}",
                request=image,
                decode_worker=lm_only,
                prefill={"mode": m, "kv_transfer_params": returned},
            )
        for field in REQUIRED_KV_FIELDS[mode]:
            less = {k: v for k, v in complete.items() if k != field}
            add(
                f"handoff/image/without_{field}/{m}/lm_only",
                f"{m} without {field}: 502",
                request=image,
                decode_worker=lm_only,
                prefill={"mode": m, "kv_transfer_params": less},
            )
        add(
            f"handoff/text/empty/{m}/lm_only",
            "text recomputes whatever it was handed",
            request=text,
            decode_worker=lm_only,
            prefill={"mode": m, "kv_transfer_params": {}},
        )
    unset = {**NIXL, "do_remote_prefill": False}
    add(
        "handoff/image/flag_false/nixl/lm_only",
        "do_remote_prefill false loads nothing: 502",
        request=image,
        decode_worker=lm_only,
        prefill={"mode": "nixl", "kv_transfer_params": unset},
    )
    legacy = {"remote_host": "p0", "remote_port": 7000}
    add(
        "handoff/image/legacy/nixl/lm_only",
        "NIXL finds no KV by host and port: 502",
        request=image,
        decode_worker=lm_only,
        prefill={"mode": "nixl", "kv_transfer_params_legacy": legacy},
    )
    add(
        "handoff/image/nulls/passthrough/lm_only",
        "an object of nulls names nothing: 502",
        request=image,
        decode_worker=lm_only,
        prefill={"mode": "passthrough", "kv_transfer_params": {"a": None, "b": ""}},
    )


def all_cases() -> list[dict[str, Any]]:
    """Every case, in the order of the document."""
    cases: list[dict[str, Any]] = []

    def add(case_id: str, description: str, operation: str = "plan", **fields: Any) -> None:
        cases.append({"id": case_id, "description": description, "operation": operation, **fields})

    shapes = {
        "text_n1": ("a text request", text_request()),
        "text_n2": ("a text request with n=2", text_request(n=2)),
        "image_n1": ("a grid-less image", image_request()),
        "image_n2": ("a grid-less image with n=2", image_request(n=2)),
        "mrope_n1": ("an image with an M-RoPE grid", mrope_request()),
        "mrope_n2": ("an M-RoPE image with n=2", mrope_request(n=2)),
        "mrope_shm_grid_n1": (
            "an M-RoPE image whose grid is in shared memory",
            mrope_request(grid_location=PayloadLocation.SHM),
        ),
        "mrope_no_hashes_n1": ("an M-RoPE image without hashes", mrope_request(hashes=False)),
        "refs_n1": ("media references", media_ref_request()),
        "refs_n2": ("media references with n=2", media_ref_request(n=2)),
    }
    for shape, (what, request) in shapes.items():
        for kind, worker in WORKERS.items():
            add(
                f"decision/{shape}/{kind}",
                f"{what}, {kind} decode worker",
                request=req(request),
                decode_worker=worker_to_json(worker),
            )

    lm_only = worker_to_json(WORKERS["lm_only"])
    vision = worker_to_json(WORKERS["vision"])
    for kind, as_json in (("lm_only", lm_only), ("vision", vision)):
        add(
            f"handoff/image/returned/{kind}",
            "prefill returned NIXL parameters",
            request=req(image_request()),
            decode_worker=as_json,
            prefill={"kv_transfer_params": NIXL},
        )
        add(
            f"handoff/image/nothing/{kind}",
            "prefill returned no KV parameters",
            request=req(image_request()),
            decode_worker=as_json,
            prefill={},
        )
    add(
        "handoff/text/nothing/lm_only",
        "text keeps the recompute fallback",
        request=req(text_request()),
        decode_worker=lm_only,
        prefill={},
    )
    add(
        "handoff/image/legacy/lm_only",
        "the legacy host/port pair counts as a Mooncake handoff",
        request=req(image_request()),
        decode_worker=lm_only,
        prefill={
            "mode": "mooncake",
            "kv_transfer_params_legacy": {"remote_host": "p0", "remote_port": 7000},
        },
    )
    _handoff_field_cases(add, lm_only)
    add(
        "handoff/image_n2/returned/vision",
        "n>1 relays nothing",
        request=req(image_request(n=2)),
        decode_worker=vision,
        prefill={"kv_transfer_params": NIXL},
    )
    already = image_request().derive(kv_transfer_params=NIXL)
    add(
        "handoff/image/preset/lm_only",
        "parameters already on the request count",
        request=req(already),
        decode_worker=lm_only,
        prefill={},
    )

    ids = tuple(range(1, 41))
    batch = MultimodalBatch(placeholders=(PlaceholderRange(2, 4),), mm_hashes=("h-img",))
    hashless = MultimodalBatch(
        pixel_values=TensorDescriptor("pixel_values", (1, 3, 8, 8), "float32", nbytes=768)
    )
    video = MultimodalBatch(modality=Modality.VIDEO, mm_hashes=("h-vid-1", "h-vid-2"))
    audio = MultimodalBatch(modality=Modality.AUDIO, mm_hashes=("h-aud",))
    legs = {
        # Media without hashes has no identity: refused wherever the decode takes the KV.
        "hashless_primary_refused": (hashless, video),
        "extras_keep_order_and_modality": (batch, video, audio),
        "hashless_only_refused": (hashless,),
        # A batch with nothing in it is no media: dropped whole.
        "empty_primary_dropped": (MultimodalBatch(), video),
    }
    for name, batches in legs.items():
        request = Request("legs", input_ids=ids, batches=batches, kv_transfer_params=NIXL)
        for kind in ("lm_only", "vision"):
            add(
                f"legs/{name}/{kind}",
                f"leg building: {name.replace('_', ' ')}",
                request=req(request),
                decode_worker=worker_to_json(WORKERS[kind]),
            )

    for location in PayloadLocation:
        grid = grid_of(location)
        gridded = MultimodalBatch(
            tensors=(grid,), mm_hashes=("h",), placeholders=(PlaceholderRange(0, 4),)
        )
        request = Request("grids", input_ids=ids, batches=(gridded,))
        add(
            f"identity/grid_{location.value}/vision",
            f"identity-only keeps only inline grids ({location.value})",
            request=req(request),
            decode_worker=vision,
        )
    sizes = TensorDescriptor("image_grid_sizes", (1,), "int64", PayloadLocation.INLINE, 8)
    shm_sizes = TensorDescriptor("image_grid_sizes", (1,), "int64", PayloadLocation.SHM, 8)
    for label, sizes_tensor in (("inline", sizes), ("shm", shm_sizes)):
        flat = MultimodalBatch(
            tensors=(grid_of(PayloadLocation.INLINE), sizes_tensor),
            mm_hashes=("h",),
            flat_keys={"image_grid_thw": "image_grid_sizes"},
            batched_keys=("image_grid_thw", "image_grid_sizes", "pixel_values"),
            keep_on_cpu_keys=("image_grid_sizes",),
        )
        add(
            f"identity/flat_sizes_{label}/vision",
            f"a flattened grid whose sizes tensor is {label}",
            request=req(Request("flat", input_ids=ids, batches=(flat,))),
            decode_worker=vision,
        )

    for i, salt in enumerate(ADVERSARIAL):
        hashes = (ADVERSARIAL[i], ADVERSARIAL[(i + 1) % len(ADVERSARIAL)])
        adversarial = Request(
            "adv", input_ids=ids, batches=(MultimodalBatch(mm_hashes=hashes),), cache_salt=salt
        )
        add(
            f"salt/adversarial_{i:02d}/lm_only",
            "adversarial hashes and caller salt",
            request=req(adversarial),
            decode_worker=lm_only,
            prefill={"kv_transfer_params": NIXL},
        )
    salt_cases = {
        "none": ([], None),
        "caller_only": ([], "tenant-1"),
        "one_image": ([("image", content_hash("dog.jpg"))], None),
        "one_image_tenant": ([("image", content_hash("dog.jpg"))], "tenant-1"),
        "split_vs_joined_a": ([("image", "a,b")], None),
        "split_vs_joined_b": ([("image", "a"), ("image", "b")], None),
        "order_ab": ([("image", "A"), ("video", "B")], "t"),
        "order_ba": ([("video", "B"), ("image", "A")], "t"),
        "modality": ([("video", "A")], None),
        "empty_salt": ([("image", "A")], ""),
        "shifted_a": ([("image", "A")], "t,B"),
        "shifted_b": ([("image", "A"), ("image", "B")], "t"),
        "many": ([("image", f"{i:064x}") for i in range(64)], "tenant"),
    }
    for name, (identities, caller) in salt_cases.items():
        add(
            f"fold_salt/{name}",
            "the salt fold, in both formats",
            "fold_salt",
            identities=[list(i) for i in identities],
            caller_salt=caller,
        )

    malformed = {
        "placeholder_past_ids": {
            "request_id": "m",
            "input_ids": [1, 2],
            "batches": [{"placeholders": [{"offset": 1, "length": 5}], "mm_hashes": ["h"]}],
        },
        "empty_hash": {"request_id": "m", "input_ids": [1], "batches": [{"mm_hashes": [""]}]},
        "refs_with_batches": {
            "request_id": "m",
            "input_ids": [1],
            "batches": [{"mm_hashes": ["h"]}],
            "media_refs": [{"url": "https://example.com/x.png"}],
        },
        "unknown_field": {"request_id": "m", "text": "hi", "priority": 1},
        "no_input": {"request_id": "m"},
        "negative_n": {"request_id": "m", "text": "hi", "n": -1},
    }
    for name, doc in malformed.items():
        add(
            f"malformed/{name}",
            "malformed input is a typed 400 naming the field",
            request=doc,
            decode_worker=lm_only,
        )
    _check_cases(add, shapes)
    media_cases(add)
    client_cases(add)
    fleet_cases(add)
    exchange_cases(add)
    wire_cases(add)
    return cases
