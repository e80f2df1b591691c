"""Conformance vectors: the policy's decisions as data, for other implementations.

Gateways in Rust, Go or C++ vendor this policy by re-implementing it. The
vectors let them prove they match: each case is an input in the JSON codec
and the outcome this implementation gives. The set is deterministic (the same
release writes the same bytes) and versioned; ``docs/conformance.md``
documents the format.

Operations:

* ``plan``: decide, build the decode leg, relay what the prefill returned (when
  the case says), run the handoff check; the outcome is the form, the leg and
  the decode worker's salt in both formats, or the error;
* ``select_decode_workers``: the indices of the candidates that can serve;
* ``ensure_model_accepts_media``: pass, or the error;
* ``worker_guard``: ``ensure_language_model_only_leg`` on a leg (``uses_mrope``
  and ``takes_mm_metadata`` optional);
* ``fold_salt``: the salt for identities and a caller's salt, in both formats;
* ``connector_mode``: a vLLM connector name's handoff contract, or the error;
* ``kv_handoff``: the handoff plan for a prefill worker and ``n`` (a fixed
  ``transfer_id``), and the prefill leg of a request under it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from .batch import Modality, MultimodalBatch, PlaceholderRange
from .codec import request_from_json, request_to_json, worker_from_json, worker_to_json
from .connectors import KvConnectorMode, PrefillKv, connector_mode, plan_kv_handoff
from .errors import PolicyError
from .legs import ensure_language_model_only_leg, metadata_only
from .outcome import PrefillResult, plan
from .prefill import prefill_leg
from .request import LegacyKvParams, MediaRef, Request
from .salt import SALT_FOLD_VERSION, fold_salt, upstream_cache_salt
from .scenarios import (
    content_hash,
    image_request,
    media_ref_request,
    mrope_request,
    text_request,
)
from .selection import DecodeCandidate, ensure_model_accepts_media, select_decode_workers
from .tensor import PayloadLocation, TensorDescriptor
from .worker import Support, WorkerCapability

__all__ = [
    "FORMAT",
    "VECTORS_VERSION",
    "Mismatch",
    "build_vectors",
    "compare_results",
    "dumps",
    "run_case",
    "run_vectors",
]

#: Name of the document format.
FORMAT: Final = "pd-policy-conformance-vectors"
#: Version of the document format; a change of meaning bumps it.
VECTORS_VERSION: Final = 2

_WORKERS: Final = {
    "vision": WorkerCapability(Support.TRUE),
    "unknown": WorkerCapability(Support.UNKNOWN),
    "lm_only": WorkerCapability(Support.FALSE),
    "lm_only_metadata": WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE),
}
_NIXL: Final = {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": "xfer-1"}

#: Salts and hashes built to break naive encodings: separators, prefixes, NUL, non-ASCII.
ADVERSARIAL: Final = ("a,b", "a", "b", ",", ":", "mm:", "mm1:", "a\x00b", "é", "日本", "x" * 300)


def _error(exc: PolicyError) -> dict[str, Any]:
    return {"status": exc.status, "error_code": exc.code, "error_param": exc.param}


def _plan_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    try:
        request = request_from_json(case["request"])
        worker = worker_from_json(case["decode_worker"])
    except PolicyError as exc:
        return _error(exc)
    prefill = None
    if "prefill" in case:
        returned = case["prefill"].get("kv_transfer_params")
        legacy = case["prefill"].get("kv_transfer_params_legacy")
        prefill = PrefillResult(
            None if returned is None else json.dumps(returned, separators=(",", ":")),
            None
            if legacy is None
            else LegacyKvParams(legacy["remote_host"], legacy["remote_port"]),
        )
    outcome = plan(request, worker, prefill)
    return _error(outcome.error) if outcome.error is not None else outcome.served_json()


def _select_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    request = request_from_json(case["request"])
    candidates = [DecodeCandidate(worker_from_json(w), i) for i, w in enumerate(case["candidates"])]
    try:
        chosen = select_decode_workers(request, candidates)
    except PolicyError as exc:
        return _error(exc)
    return {"status": 200, "selected": [c.handle for c in chosen]}


def _media_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    request = request_from_json(case["request"])
    try:
        ensure_model_accepts_media(request, [worker_from_json(w) for w in case["workers"]])
    except PolicyError as exc:
        return _error(exc)
    return {"status": 200}


def _guard_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    try:
        ensure_language_model_only_leg(
            request_from_json(case["request"]),
            uses_mrope=case.get("uses_mrope", False),
            takes_mm_metadata=case.get("takes_mm_metadata", False),
        )
    except PolicyError as exc:
        return _error(exc)
    return {"status": 200}


def _salt_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    identities = [(Modality(m), h) for m, h in case["identities"]]
    return {
        "status": 200,
        "cache_salt": fold_salt(identities, case["caller_salt"]),
        "upstream_cache_salt": upstream_cache_salt(h for _, h in identities),
    }


def _connector_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return {"status": 200, "mode": connector_mode(case["kv_connector"]).value}
    except PolicyError as exc:
        return _error(exc)


def _handoff_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    spec = dict(case["prefill_kv"])
    try:
        kv = PrefillKv(KvConnectorMode(spec.pop("mode")), **spec)
    except PolicyError as exc:
        return _error(exc)
    handoff = plan_kv_handoff(kv, n=case["n"], transfer_id=case["transfer_id"])
    legacy = handoff.decode_legacy
    outcome: dict[str, Any] = {
        "status": 200,
        "runs_prefill": handoff.runs_prefill,
        "prefill_params": None
        if handoff.prefill_params is None
        else json.loads(handoff.prefill_params),
        "decode_params": None
        if handoff.decode_params is None
        else json.loads(handoff.decode_params),
        "decode_legacy": None if legacy is None else [legacy.remote_host, legacy.remote_port],
        "relays": handoff.relays,
        "dp_rank": handoff.dp_rank,
    }
    if "request" in case and handoff.runs_prefill:
        outcome["prefill_leg"] = request_to_json(
            prefill_leg(request_from_json(case["request"]), handoff)
        )
    return outcome


_OPERATIONS: Final[dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]]] = {
    "plan": _plan_outcome,
    "connector_mode": _connector_outcome,
    "kv_handoff": _handoff_outcome,
    "select_decode_workers": _select_outcome,
    "ensure_model_accepts_media": _media_outcome,
    "worker_guard": _guard_outcome,
    "fold_salt": _salt_outcome,
}


def run_case(case: Mapping[str, Any]) -> dict[str, Any]:
    """This implementation's outcome for one case (its ``operation`` and input)."""
    return _OPERATIONS[case["operation"]](case)


# --- the cases ---------------------------------------------------------------------


def _req(request: Request) -> dict[str, Any]:
    return request_to_json(request)


def _grid(location: PayloadLocation, name: str = "image_grid_thw") -> TensorDescriptor:
    return TensorDescriptor(
        name, (1, 3), "int64", location, 0 if location is PayloadLocation.NONE else 24
    )


def _cases() -> list[dict[str, Any]]:
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
        for kind, worker in _WORKERS.items():
            add(
                f"decision/{shape}/{kind}",
                f"{what}, {kind} decode worker",
                request=_req(request),
                decode_worker=worker_to_json(worker),
            )

    lm_only = worker_to_json(_WORKERS["lm_only"])
    vision = worker_to_json(_WORKERS["vision"])
    for kind, as_json in (("lm_only", lm_only), ("vision", vision)):
        add(
            f"handoff/image/returned/{kind}",
            "prefill returned NIXL parameters",
            request=_req(image_request()),
            decode_worker=as_json,
            prefill={"kv_transfer_params": _NIXL},
        )
        add(
            f"handoff/image/nothing/{kind}",
            "prefill returned no KV parameters",
            request=_req(image_request()),
            decode_worker=as_json,
            prefill={},
        )
    add(
        "handoff/text/nothing/lm_only",
        "text keeps the recompute fallback",
        request=_req(text_request()),
        decode_worker=lm_only,
        prefill={},
    )
    add(
        "handoff/image/legacy/lm_only",
        "the legacy host/port pair counts as a handoff",
        request=_req(image_request()),
        decode_worker=lm_only,
        prefill={"kv_transfer_params_legacy": {"remote_host": "p0", "remote_port": 7000}},
    )
    add(
        "handoff/image_n2/returned/vision",
        "n>1 relays nothing",
        request=_req(image_request(n=2)),
        decode_worker=vision,
        prefill={"kv_transfer_params": _NIXL},
    )
    already = image_request().derive(kv_transfer_params=_NIXL)
    add(
        "handoff/image/preset/lm_only",
        "parameters already on the request count",
        request=_req(already),
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
        "hashless_primary_dropped": (hashless, video),
        "extras_keep_order_and_modality": (batch, video, audio),
        "hashless_only": (hashless,),
    }
    for name, batches in legs.items():
        request = Request("legs", input_ids=ids, batches=batches, kv_transfer_params=_NIXL)
        for kind in ("lm_only", "vision"):
            add(
                f"legs/{name}/{kind}",
                f"leg building: {name.replace('_', ' ')}",
                request=_req(request),
                decode_worker=worker_to_json(_WORKERS[kind]),
            )

    for location in PayloadLocation:
        grid = _grid(location)
        gridded = MultimodalBatch(
            tensors=(grid,), mm_hashes=("h",), placeholders=(PlaceholderRange(0, 4),)
        )
        request = Request("grids", input_ids=ids, batches=(gridded,))
        add(
            f"identity/grid_{location.value}/vision",
            f"identity-only keeps only inline grids ({location.value})",
            request=_req(request),
            decode_worker=vision,
        )
    sizes = TensorDescriptor("image_grid_sizes", (1,), "int64", PayloadLocation.INLINE, 8)
    shm_sizes = TensorDescriptor("image_grid_sizes", (1,), "int64", PayloadLocation.SHM, 8)
    for label, sizes_tensor in (("inline", sizes), ("shm", shm_sizes)):
        flat = MultimodalBatch(
            tensors=(_grid(PayloadLocation.INLINE), sizes_tensor),
            mm_hashes=("h",),
            flat_keys={"image_grid_thw": "image_grid_sizes"},
            batched_keys=("image_grid_thw", "image_grid_sizes", "pixel_values"),
            keep_on_cpu_keys=("image_grid_sizes",),
        )
        add(
            f"identity/flat_sizes_{label}/vision",
            f"a flattened grid whose sizes tensor is {label}",
            request=_req(Request("flat", input_ids=ids, batches=(flat,))),
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
            request=_req(adversarial),
            decode_worker=lm_only,
            prefill={"kv_transfer_params": _NIXL},
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

    capable_last = [lm_only, worker_to_json(_WORKERS["unknown"]), vision]
    for shape in ("image_n1", "mrope_n1", "refs_n2", "text_n2"):
        add(
            f"select/{shape}/mixed",
            "selection keeps the caller's order",
            "select_decode_workers",
            request=_req(shapes[shape][1]),
            candidates=capable_last,
        )
        add(
            f"select/{shape}/lm_only_pool",
            "a pool of language-model-only workers",
            "select_decode_workers",
            request=_req(shapes[shape][1]),
            candidates=[lm_only, lm_only],
        )
    add(
        "select/empty",
        "no candidates",
        "select_decode_workers",
        request=_req(text_request()),
        candidates=[],
    )

    pools = {
        "lm_only": [lm_only, lm_only],
        "mixed": [lm_only, vision],
        "empty": [],
        "unlabelled": [lm_only, worker_to_json(_WORKERS["unknown"])],
    }
    for pool, members in pools.items():
        for shape in ("image_n1", "refs_n1", "text_n1"):
            add(
                f"model_media/{shape}/{pool}",
                "refuse media when no worker has an encoder",
                "ensure_model_accepts_media",
                request=_req(shapes[shape][1]),
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
        add(f"worker_guard/{name}", "the decode worker's guard", "worker_guard", request=_req(leg))
    for name in ("stripped", "text"):
        add(
            f"worker_guard/{name}/mrope_model",
            "the guard on an M-RoPE model's worker",
            "worker_guard",
            request=_req(guard_legs[name]),
            uses_mrope=True,
        )
    for name in ("NixlConnector", "TransferConnector", "MooncakeConnector", "ExampleConnector",
                 "", "nixl", "MyConnector"):  # fmt: skip
        add(f"connector/{name or 'none'}", "a connector's handoff contract", "connector_mode",
            kv_connector=name)  # fmt: skip
    grid_no_cpu = attrs.evolve(mrope_request().batches[0], keep_on_cpu_keys=())
    grid_request = mrope_request().derive(batches=(grid_no_cpu,))
    workers_kv: dict[str, dict[str, Any]] = {
        "nixl": {"mode": "nixl"},
        "passthrough": {"mode": "passthrough"},
        "mooncake": {"mode": "mooncake", "engine_id": "p0", "bootstrap_host": "10.0.0.1"},
        "mooncake_ipv6": {"mode": "mooncake", "engine_id": "p0", "bootstrap_host": "fd00::1",
                          "bootstrap_port": 9000},
        "mooncake_dp_pinned": {"mode": "mooncake", "engine_id": "p0", "bootstrap_host": "h",
                               "dp_size": 4, "dp_rank": 1},
        "mooncake_dp_unpinned": {"mode": "mooncake", "engine_id": "p0", "bootstrap_host": "h",
                                 "dp_size": 4},
        "mooncake_legacy": {"mode": "mooncake", "bootstrap_host": "h", "bootstrap_port": 7000},
        "mooncake_no_host": {"mode": "mooncake", "engine_id": "p0"},
    }  # fmt: skip
    for name, spec in workers_kv.items():
        for n in (1, 2):
            add(f"kv_handoff/{name}/n{n}", "the KV handoff plan and the prefill leg",
                "kv_handoff", prefill_kv=spec, n=n, transfer_id="xfer-0001",
                request=_req(grid_request.derive(n=n)))  # fmt: skip
    metadata = worker_to_json(_WORKERS["lm_only_metadata"])
    add("handoff/mrope/returned/lm_only_metadata", "the metadata leg relays the handoff",
        request=_req(mrope_request()), decode_worker=metadata,
        prefill={"kv_transfer_params": _NIXL})  # fmt: skip
    add("handoff/mrope/nothing/lm_only_metadata", "a metadata leg without a handoff is a 502",
        request=_req(mrope_request()), decode_worker=metadata, prefill={})  # fmt: skip
    add("handoff/mrope/legacy/lm_only_metadata", "the legacy pair counts for a metadata leg",
        request=_req(mrope_request()), decode_worker=metadata,
        prefill={"kv_transfer_params_legacy": {"remote_host": "p", "remote_port": 1}})  # fmt: skip
    base = mrope_request()
    gaps = {
        "text_input": base.derive(
            input_ids=None, text="hi", batches=(attrs.evolve(base.batches[0], placeholders=()),)
        ),
        "no_placeholders": base.derive(
            batches=(attrs.evolve(base.batches[0], placeholders=()),)
        ),
        "remote_grid": mrope_request(grid_location=PayloadLocation.REMOTE),
        "payloadless_grid": mrope_request(grid_location=PayloadLocation.NONE),
        "grid_in_one_batch_only": base.derive(
            batches=(base.batches[0], MultimodalBatch(mm_hashes=("h-2",)))
        ),
        "shm_sizes": base.derive(batches=(attrs.evolve(
            base.batches[0],
            tensors=(*base.batches[0].tensors,
                     TensorDescriptor("image_grid_sizes", (1,), "int64", PayloadLocation.SHM, 8)),
            flat_keys={"image_grid_thw": "image_grid_sizes"},
        ),)),
    }  # fmt: skip
    for name, request in gaps.items():
        add(f"metadata/{name}/lm_only_metadata", "what a metadata leg needs, or the 400",
            request=_req(request), decode_worker=metadata,
            prefill={"kv_transfer_params": _NIXL})  # fmt: skip
    metadata_leg = _req(metadata_only(mrope_request().derive(kv_transfer_params=_NIXL)))
    without_kv = dict(metadata_leg)
    del without_kv["kv_transfer_params"]
    for name, leg_json in (("metadata_leg", metadata_leg), ("metadata_leg_no_kv", without_kv)):
        for takes in (True, False):
            add(f"worker_guard/{name}/{'takes' if takes else 'no'}_metadata",
                "the guard on a worker that does or does not take metadata", "worker_guard",
                request=leg_json, uses_mrope=True, takes_mm_metadata=takes)  # fmt: skip
    add(
        "refs/credentials/lm_only",
        "a media reference with credentials in its URL",
        request=_req(
            Request("r", input_ids=(1,), media_refs=(MediaRef(Modality.IMAGE, "https://u:p@h/x"),))
        ),
        decode_worker=lm_only,
    )
    return cases


def build_vectors() -> dict[str, Any]:
    """The whole document: format, versions, and every case with its expected outcome."""
    from . import __version__

    cases = _cases()
    for case in cases:
        case["expected"] = run_case(case)
    return {
        "format": FORMAT,
        "version": VECTORS_VERSION,
        "pd_policy_version": __version__,
        "salt_fold_version": SALT_FOLD_VERSION,
        "cases": cases,
    }


def dumps(document: Mapping[str, Any]) -> str:
    """The canonical text of a vectors or results document: the same data, the same bytes."""
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def run_vectors(document: Mapping[str, Any]) -> dict[str, Any]:
    """This implementation's results for a vectors document, in the results format."""
    return {
        "format": f"{FORMAT}-results",
        "version": VECTORS_VERSION,
        "results": [{"id": c["id"], "outcome": run_case(c)} for c in document["cases"]],
    }


@attrs.frozen(slots=True)
class Mismatch:
    """A case whose outcome differs: its id and what differs."""

    case_id: str
    detail: str

    def __str__(self) -> str:
        return f"{self.case_id}: {self.detail}"


def compare_results(vectors: Mapping[str, Any], results: Mapping[str, Any]) -> list[Mismatch]:
    """Every case whose outcome in ``results`` differs from the expected one, or is missing.

    Only the outcome's data counts (status, form, leg, salts, error code and
    param); error messages are free to differ.
    """
    theirs = {r["id"]: r["outcome"] for r in results.get("results", [])}
    mismatches = []
    for case in vectors["cases"]:
        case_id = case["id"]
        if case_id not in theirs:
            mismatches.append(Mismatch(case_id, "no result"))
            continue
        expected, actual = case["expected"], theirs[case_id]
        for key in sorted(set(expected) | set(actual)):
            if expected.get(key) != actual.get(key):
                mismatches.append(
                    Mismatch(
                        case_id, f"{key}: expected {expected.get(key)!r}, got {actual.get(key)!r}"
                    )
                )
    known = {c["id"] for c in vectors["cases"]}
    mismatches += [Mismatch(i, "not a case of these vectors") for i in theirs if i not in known]
    return mismatches
