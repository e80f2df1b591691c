"""A strict JSON codec for requests and workers: dicts in, dicts out.

Used by the CLI, the docs and the conformance vectors. Decoding is strict: an
unknown key, a missing required key or a value of the wrong type raises
[`MalformedRequest`][pd_policy.errors.MalformedRequest] whose ``param`` names the field by
its path (``batches[0].tensors.image_grid_thw.shape``). ``null`` is the absent value of
an optional field whose default is absent (``input_ids``, ``text``, the KV parameters,
``cache_salt``, ``pixel_values``, ``im_token_id``, ``encoder_input_key``, and a
worker's two support values, ``ec_role``, ``kv_load`` and ``kv_load_failure_policy``);
for any other field it is the wrong type. Text is read with
[`loads_strict`][pd_policy.jsontext.loads_strict] (a key twice is refused). Encoding
is the exact inverse: ``request_from_json(request_to_json(r)) == r``.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from .batch import Modality, MultimodalBatch, PlaceholderRange
from .decode_kv import DecodeKv, KvLoad, LoadFailure
from .encoder_cache import EncoderCacheRole
from .jsonread import _build, _enum, _expect, _fail, _int, _join, _list, _obj, _opt, _str
from .request import LegacyKvParams, MediaRef, Request
from .tensor import PayloadLocation, TensorDescriptor
from .worker import Support, WorkerCapability

__all__ = ["request_from_json", "request_to_json", "worker_from_json", "worker_to_json"]

T = TypeVar("T")

_TENSOR_KEYS: tuple[frozenset[str], frozenset[str]] = (
    frozenset({"shape", "dtype"}),
    frozenset({"location", "nbytes"}),
)


def _tensor(name: str, value: object, path: str) -> TensorDescriptor:
    obj = _obj(value, path, *_TENSOR_KEYS)
    shape = _list(obj["shape"], _join(path, "shape"), _int)
    dtype = _str(obj["dtype"], _join(path, "dtype"))
    location = _enum(PayloadLocation, obj.get("location", "inline"), _join(path, "location"))
    nbytes = _int(obj.get("nbytes", 0), _join(path, "nbytes"))
    return _build(path, lambda: TensorDescriptor(name, tuple(shape), dtype, location, nbytes))


def _tensor_to_json(t: TensorDescriptor) -> dict[str, Any]:
    return {
        "shape": list(t.shape),
        "dtype": t.dtype,
        "location": t.location.value,
        "nbytes": t.nbytes,
    }


def _modality(value: object, path: str) -> Modality:
    # The wire's MODALITY_UNSPECIFIED means image.
    if value == "unspecified":
        return Modality.IMAGE
    result: Modality = _enum(Modality, value, path)
    return result


_BATCH_KEYS: tuple[frozenset[str], frozenset[str]] = (
    frozenset(),
    frozenset(
        {
            "modality",
            "pixel_values",
            "tensors",
            "placeholders",
            "mm_hashes",
            "im_token_id",
            "batched_keys",
            "flat_keys",
            "keep_on_cpu_keys",
            "encoder_input_key",
        }
    ),
)


def _placeholder(value: object, path: str) -> PlaceholderRange:
    obj = _obj(value, path, frozenset({"offset", "length"}), frozenset())
    offset = _int(obj["offset"], _join(path, "offset"))
    length = _int(obj["length"], _join(path, "length"))
    return _build(path, lambda: PlaceholderRange(offset, length))


def _str_map(value: object, path: str) -> dict[str, str]:
    obj = _expect(value, dict, path)
    return {k: _str(v, _join(path, k)) for k, v in obj.items()}


def _batch(value: object, path: str) -> MultimodalBatch:
    obj = _obj(value, path, *_BATCH_KEYS)
    tensors_obj = _expect(obj.get("tensors", {}), dict, _join(path, "tensors"))
    tensors = [
        _tensor(name, t, _join(_join(path, "tensors"), name)) for name, t in tensors_obj.items()
    ]
    pixels = _opt(obj, "pixel_values", path, lambda v, p: _tensor("pixel_values", v, p))
    kwargs: dict[str, Any] = {
        "modality": _modality(obj.get("modality", "image"), _join(path, "modality")),
        "pixel_values": pixels,
        "tensors": tensors,
        "placeholders": _list(
            obj.get("placeholders", []), _join(path, "placeholders"), _placeholder
        ),
        "mm_hashes": _list(obj.get("mm_hashes", []), _join(path, "mm_hashes"), _str),
        "im_token_id": _opt(obj, "im_token_id", path, _int),
        "batched_keys": _list(obj.get("batched_keys", []), _join(path, "batched_keys"), _str),
        "flat_keys": _str_map(obj.get("flat_keys", {}), _join(path, "flat_keys")),
        "keep_on_cpu_keys": _list(
            obj.get("keep_on_cpu_keys", []), _join(path, "keep_on_cpu_keys"), _str
        ),
        "encoder_input_key": _opt(obj, "encoder_input_key", path, _str),
    }
    return _build(path, lambda: MultimodalBatch(**kwargs))


def _batch_to_json(b: MultimodalBatch) -> dict[str, Any]:
    out: dict[str, Any] = {"modality": b.modality.value}
    if b.pixel_values is not None:
        out["pixel_values"] = _tensor_to_json(b.pixel_values)
    if b.tensors:
        out["tensors"] = {t.name: _tensor_to_json(t) for t in b.tensors}
    if b.placeholders:
        out["placeholders"] = [{"offset": p.offset, "length": p.length} for p in b.placeholders]
    if b.mm_hashes:
        out["mm_hashes"] = list(b.mm_hashes)
    if b.im_token_id is not None:
        out["im_token_id"] = b.im_token_id
    if b.batched_keys:
        out["batched_keys"] = list(b.batched_keys)
    if b.flat_keys:
        out["flat_keys"] = dict(b.flat_keys)
    if b.keep_on_cpu_keys:
        out["keep_on_cpu_keys"] = list(b.keep_on_cpu_keys)
    if b.encoder_input_key is not None:
        out["encoder_input_key"] = b.encoder_input_key
    return out


def _media_ref(value: object, path: str) -> MediaRef:
    obj = _obj(value, path, frozenset({"url"}), frozenset({"modality"}))
    modality = _modality(obj.get("modality", "image"), _join(path, "modality"))
    url = _str(obj["url"], _join(path, "url"))
    return _build(path, lambda: MediaRef(modality, url))


def _legacy(value: object, path: str) -> LegacyKvParams:
    obj = _obj(value, path, frozenset({"remote_host", "remote_port"}), frozenset())
    host = _str(obj["remote_host"], _join(path, "remote_host"))
    port = _int(obj["remote_port"], _join(path, "remote_port"))
    return _build(path, lambda: LegacyKvParams(host, port))


_REQUEST_KEYS: tuple[frozenset[str], frozenset[str]] = (
    frozenset({"request_id"}),
    frozenset(
        {
            "input_ids",
            "text",
            "batches",
            "media_refs",
            "n",
            "kv_transfer_params",
            "kv_transfer_params_legacy",
            "cache_salt",
        }
    ),
)


def request_from_json(value: object) -> Request:
    """Decode a request from its JSON form (a dict). Raises ``MalformedRequest``."""
    obj = _obj(value, "", *_REQUEST_KEYS)
    kv = obj.get("kv_transfer_params")
    if kv is not None:
        _expect(kv, dict, "kv_transfer_params")
    kwargs: dict[str, Any] = {
        "request_id": _str(obj["request_id"], "request_id"),
        "input_ids": _opt(obj, "input_ids", "", lambda v, p: _list(v, p, _int)),
        "text": _opt(obj, "text", "", _str),
        "batches": _list(obj.get("batches", []), "batches", _batch),
        "media_refs": _list(obj.get("media_refs", []), "media_refs", _media_ref),
        "n": _int(obj.get("n", 1), "n"),
        "kv_transfer_params": kv,
        "kv_legacy": _opt(obj, "kv_transfer_params_legacy", "", _legacy),
        "cache_salt": _opt(obj, "cache_salt", "", _str),
    }
    return _build("", lambda: Request(**kwargs))


def request_to_json(request: Request) -> dict[str, Any]:
    """Encode a request as its JSON form; the inverse of
    [`request_from_json`][pd_policy.codec.request_from_json]."""
    out: dict[str, Any] = {"request_id": request.request_id}
    if request.input_ids is not None:
        out["input_ids"] = list(request.input_ids)
    else:
        out["text"] = request.text
    if request.batches:
        out["batches"] = [_batch_to_json(b) for b in request.batches]
    if request.media_refs:
        out["media_refs"] = [
            {"modality": r.modality.value, "url": r.url} for r in request.media_refs
        ]
    out["n"] = request.n
    if request.kv_transfer_params is not None:
        out["kv_transfer_params"] = json.loads(request.kv_transfer_params)
    if request.kv_legacy is not None:
        out["kv_transfer_params_legacy"] = {
            "remote_host": request.kv_legacy.remote_host,
            "remote_port": request.kv_legacy.remote_port,
        }
    if request.cache_salt is not None:
        out["cache_salt"] = request.cache_salt
    return out


_WORKER_KEYS: tuple[frozenset[str], frozenset[str]] = (
    frozenset(),
    frozenset(
        {
            "supports_vision",
            "mm_processor",
            "mm_media_ref_schemes",
            "accepts_mm_metadata",
            "ec_role",
            "kv_load",
            "kv_load_failure_policy",
        }
    ),
)
_ROLES = {r.value: r for r in EncoderCacheRole if r is not EncoderCacheRole.UNKNOWN}
_LOADS = {k.value: k for k in KvLoad if k is not KvLoad.UNKNOWN}
_FAILURES = {f.value: f for f in LoadFailure if f is not LoadFailure.UNKNOWN}


def _loads(value: object, path: str) -> KvLoad:
    if _expect(value, str, path) not in _LOADS:
        raise _fail(path, "expected request, content or none")
    return _LOADS[value]


def _failure(value: object, path: str) -> LoadFailure:
    if _expect(value, str, path) not in _FAILURES:
        raise _fail(path, "expected fail or recompute")
    return _FAILURES[value]


def _role(value: object, path: str) -> EncoderCacheRole:
    if _expect(value, str, path) not in _ROLES:
        raise _fail(path, "expected producer, consumer or none")
    return _ROLES[value]


def worker_from_json(value: object) -> WorkerCapability:
    """Decode a worker capability: ``supports_vision`` and ``accepts_mm_metadata`` are
    ``true``, ``false`` or ``null`` (absent: ``null``); ``ec_role`` is ``producer``,
    ``consumer``, ``none`` or ``null`` (absent: unknown); ``kv_load`` is ``request``,
    ``content``, ``none`` or ``null`` and ``kv_load_failure_policy`` ``fail``,
    ``recompute`` or ``null`` ([`DecodeKv`][pd_policy.decode_kv.DecodeKv])."""
    obj = _obj(value, "", *_WORKER_KEYS)
    vision = _opt(obj, "supports_vision", "", lambda v, p: _expect(v, bool, p))
    metadata = _opt(obj, "accepts_mm_metadata", "", lambda v, p: _expect(v, bool, p))
    processor = _str(obj.get("mm_processor", ""), "mm_processor")
    schemes = _list(obj.get("mm_media_ref_schemes", []), "mm_media_ref_schemes", _str)
    role = _opt(obj, "ec_role", "", _role) or EncoderCacheRole.UNKNOWN
    loads = _opt(obj, "kv_load", "", _loads) or KvLoad.UNKNOWN
    failure = _opt(obj, "kv_load_failure_policy", "", _failure) or LoadFailure.UNKNOWN
    return _build(
        "",
        lambda: WorkerCapability(
            Support.from_bool(vision),
            processor,
            tuple(schemes),
            Support.from_bool(metadata),
            role,
            DecodeKv(loads, failure),
        ),
    )


def worker_to_json(worker: WorkerCapability) -> dict[str, Any]:
    """Encode a worker capability; the inverse of
    [`worker_from_json`][pd_policy.codec.worker_from_json]."""
    out = {
        "supports_vision": worker.supports_vision.to_bool(),
        "mm_processor": worker.mm_processor,
        "mm_media_ref_schemes": list(worker.mm_media_ref_schemes),
    }
    if worker.accepts_mm_metadata is not Support.UNKNOWN:
        out["accepts_mm_metadata"] = worker.accepts_mm_metadata.to_bool()
    if worker.encoder_cache is not EncoderCacheRole.UNKNOWN:
        out["ec_role"] = worker.encoder_cache.value
    if worker.decode_kv.loads is not KvLoad.UNKNOWN:
        out["kv_load"] = worker.decode_kv.loads.value
    if worker.decode_kv.on_failure is not LoadFailure.UNKNOWN:
        out["kv_load_failure_policy"] = worker.decode_kv.on_failure.value
    return out
