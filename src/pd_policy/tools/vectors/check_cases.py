"""The conformance cases of the operations besides ``plan``: selection, the media check,
the worker guard, connectors, the KV handoff plan and the M-RoPE metadata gaps."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from pd_policy.batch import Modality, MultimodalBatch, PlaceholderRange
from pd_policy.codec import worker_to_json
from pd_policy.legs import metadata_only
from pd_policy.request import MediaRef, Request
from pd_policy.tensor import PayloadLocation, TensorDescriptor
from pd_policy.tools.scenarios import (
    image_request,
    media_ref_request,
    mrope_request,
    text_request,
)

from .fixtures import NIXL, WORKERS, req

__all__ = ["check_cases"]


def check_cases(add: Callable[..., None], shapes: Mapping[str, tuple[str, Request]]) -> None:
    """Append the cases, through ``add(case_id, description, operation, **fields)``."""
    lm_only = worker_to_json(WORKERS["lm_only"])
    vision = worker_to_json(WORKERS["vision"])
    ids = tuple(range(1, 41))
    batch = MultimodalBatch(placeholders=(PlaceholderRange(2, 4),), mm_hashes=("h-img",))
    capable_last = [lm_only, worker_to_json(WORKERS["unknown"]), vision]
    for shape in ("image_n1", "mrope_n1", "refs_n2", "text_n2"):
        add(
            f"select/{shape}/mixed",
            "selection keeps the caller's order",
            "select_decode_workers",
            request=req(shapes[shape][1]),
            candidates=capable_last,
        )
        add(
            f"select/{shape}/lm_only_pool",
            "a pool of language-model-only workers",
            "select_decode_workers",
            request=req(shapes[shape][1]),
            candidates=[lm_only, lm_only],
        )
    add(
        "select/empty",
        "no candidates",
        "select_decode_workers",
        request=req(text_request()),
        candidates=[],
    )

    pools = {
        "lm_only": [lm_only, lm_only],
        "mixed": [lm_only, vision],
        "empty": [],
        "unlabelled": [lm_only, worker_to_json(WORKERS["unknown"])],
    }
    for pool, members in pools.items():
        for shape in ("image_n1", "refs_n1", "text_n1"):
            add(
                f"model_media/{shape}/{pool}",
                "refuse media when no worker has an encoder",
                "ensure_model_accepts_media",
                request=req(shapes[shape][1]),
                workers=members,
            )

    stripped = Request("g", input_ids=ids, batches=(MultimodalBatch(mm_hashes=("h",)),))
    guard_legs = {
        "stripped": stripped,
        "text": Request("g", input_ids=ids),
        "pixels": image_request(),
        "grids": mrope_request(),
        "placeholders": Request("g", input_ids=ids, batches=(batch,)),
        "media_refs": media_ref_request(),
        "n_samples": stripped.derive(n=2),
    }
    for name, leg in guard_legs.items():
        add(f"worker_guard/{name}", "the decode worker's guard", "worker_guard", request=req(leg))
    for name in ("stripped", "text"):
        add(
            f"worker_guard/{name}/mrope_model",
            "the guard on an M-RoPE model's worker",
            "worker_guard",
            request=req(guard_legs[name]),
            uses_mrope=True,
        )
    for name in (
        "NixlConnector",
        "TransferConnector",
        "MooncakeConnector",
        "ExampleConnector",
        "",
        "nixl",
        "MyConnector",
    ):
        add(
            f"connector/{name or 'none'}",
            "a connector's handoff contract",
            "connector_mode",
            kv_connector=name,
        )
    grid_no_cpu = attrs.evolve(mrope_request().batches[0], keep_on_cpu_keys=())
    grid_request = mrope_request().derive(batches=(grid_no_cpu,))
    workers_kv: dict[str, dict[str, Any]] = {
        "nixl": {"mode": "nixl"},
        "transfer": {"mode": "transfer"},
        "passthrough": {"mode": "passthrough"},
        "mooncake": {"mode": "mooncake", "engine_id": "p0", "bootstrap_host": "10.0.0.1"},
        "mooncake_ipv6": {
            "mode": "mooncake",
            "engine_id": "p0",
            "bootstrap_host": "fd00::1",
            "bootstrap_port": 9000,
        },
        "mooncake_dp_pinned": {
            "mode": "mooncake",
            "engine_id": "p0",
            "bootstrap_host": "h",
            "dp_size": 4,
            "dp_rank": 1,
        },
        "mooncake_dp_unpinned": {
            "mode": "mooncake",
            "engine_id": "p0",
            "bootstrap_host": "h",
            "dp_size": 4,
        },
        "mooncake_legacy": {"mode": "mooncake", "bootstrap_host": "h", "bootstrap_port": 7000},
        "mooncake_no_host": {"mode": "mooncake", "engine_id": "p0"},
    }
    for name, spec in workers_kv.items():
        for n in (1, 2):
            add(
                f"kv_handoff/{name}/n{n}",
                "the KV handoff plan and the prefill leg",
                "kv_handoff",
                prefill_kv=spec,
                n=n,
                transfer_id="xfer-0001",
                request=req(grid_request.derive(n=n)),
            )
    metadata = worker_to_json(WORKERS["lm_only_metadata"])
    add(
        "handoff/mrope/returned/lm_only_metadata",
        "the metadata leg relays the handoff",
        request=req(mrope_request()),
        decode_worker=metadata,
        prefill={"kv_transfer_params": NIXL},
    )
    add(
        "handoff/mrope/nothing/lm_only_metadata",
        "a metadata leg without a handoff is a 502",
        request=req(mrope_request()),
        decode_worker=metadata,
        prefill={},
    )
    add(
        "handoff/mrope/legacy/lm_only_metadata",
        "the legacy pair counts for a metadata leg",
        request=req(mrope_request()),
        decode_worker=metadata,
        prefill={
            "mode": "mooncake",
            "kv_transfer_params_legacy": {"remote_host": "p", "remote_port": 1},
        },
    )
    base = mrope_request()
    gaps = {
        "text_input": base.derive(
            input_ids=None, text="hi", batches=(attrs.evolve(base.batches[0], placeholders=()),)
        ),
        "no_placeholders": base.derive(batches=(attrs.evolve(base.batches[0], placeholders=()),)),
        "remote_grid": mrope_request(grid_location=PayloadLocation.REMOTE),
        "payloadless_grid": mrope_request(grid_location=PayloadLocation.NONE),
        "grid_in_one_batch_only": base.derive(
            batches=(base.batches[0], MultimodalBatch(mm_hashes=("h-2",)))
        ),
        "shm_sizes": base.derive(
            batches=(
                attrs.evolve(
                    base.batches[0],
                    tensors=(
                        *base.batches[0].tensors,
                        TensorDescriptor("image_grid_sizes", (1,), "int64", PayloadLocation.SHM, 8),
                    ),
                    flat_keys={"image_grid_thw": "image_grid_sizes"},
                ),
            )
        ),
    }
    for name, request in gaps.items():
        add(
            f"metadata/{name}/lm_only_metadata",
            "what a metadata leg needs, or the 400",
            request=req(request),
            decode_worker=metadata,
            prefill={"kv_transfer_params": NIXL},
        )
    metadata_leg = req(metadata_only(mrope_request().derive(kv_transfer_params=NIXL)))
    without_kv = dict(metadata_leg)
    del without_kv["kv_transfer_params"]
    for name, leg_json in (("metadata_leg", metadata_leg), ("metadata_leg_no_kv", without_kv)):
        for takes in (True, False):
            add(
                f"worker_guard/{name}/{'takes' if takes else 'no'}_metadata",
                "the guard on a worker that does or does not take metadata",
                "worker_guard",
                request=leg_json,
                uses_mrope=True,
                takes_mm_metadata=takes,
            )
    add(
        "refs/credentials/lm_only",
        "a media reference with credentials in its URL",
        request=req(
            Request("r", input_ids=(1,), media_refs=(MediaRef(Modality.IMAGE, "https://u:p@h/x"),))
        ),
        decode_worker=lm_only,
    )
    _epd_cases(add, req)


def _epd_cases(add: Callable[..., None], req: Callable[[Request], Any]) -> None:
    """E/P/D: the prefill leg for a cache consumer from the encoder's answer, or the error."""

    def answer(request: Request, *, metadata: bool, skip: int = -1) -> dict[str, Any]:
        items = [h for b in request.batches for h in b.mm_hashes]
        meta = {"image_grid_thw": [[1, 2, 2]]} if metadata else {}
        return {
            h: {"item_indices": [i], "metadata": meta} for i, h in enumerate(items) if i != skip
        }

    qwen, llava = mrope_request(), image_request()
    cases = {
        "metadata": (qwen, answer(qwen, metadata=True)),
        "image": (llava, answer(llava, metadata=False)),
        "missing_item": (qwen, answer(qwen, metadata=True, skip=0)),
        "no_answer": (llava, None),
        "hashless": (mrope_request(hashes=False), {}),
        "no_placeholders": (
            qwen.derive(batches=[attrs.evolve(b, placeholders=()) for b in qwen.batches]),
            answer(qwen, metadata=True),
        ),
    }
    for name, (request, params) in cases.items():
        add(
            f"epd_prefill/{name}",
            "the prefill leg of a cache consumer, or the error",
            "epd_prefill",
            request=req(request),
            ec_transfer_params=params,
        )
