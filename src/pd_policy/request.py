"""The request as the policy sees it: ids or text, multimodal batches, media references,
sampling ``n``, KV transfer parameters and the caller's cache salt."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from .batch import Modality, MultimodalBatch
from .errors import MalformedRequest
from .fields import UINT32_MAX, instance_of, redacted_repr
from .jsontext import loads_strict

__all__ = ["LegacyKvParams", "MediaRef", "Request", "kv_params_text"]


def _check_url(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise MalformedRequest("a media reference needs a non-empty URL", param="url")


@attrs.frozen(slots=True)
class MediaRef:
    """A media item the router did not process: each leg would expand it itself.

    The URL may carry credentials, so it never appears in a repr or an error.
    """

    modality: Modality = attrs.field(validator=instance_of(Modality))
    url: str = attrs.field(validator=_check_url, repr=redacted_repr)

    @property
    def scheme(self) -> str:
        """The URL scheme, lower-cased (``""`` when the URL has none)."""
        colon = self.url.find(":")  # not partition: it would copy the rest of the URL
        return self.url[:colon].lower() if colon >= 0 else ""


def _check_port(_inst: object, _attr: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or not 0 <= value <= 65535:
        raise MalformedRequest("remote_port must be an integer in 0..65535", "remote_port")


@attrs.frozen(slots=True)
class LegacyKvParams:
    """The legacy typed KV handoff (Mooncake without an engine id): a host and a port.

    The host is an address: it never appears in a repr or an error."""

    remote_host: str = attrs.field(validator=instance_of(str), repr=redacted_repr)
    remote_port: int = attrs.field(validator=_check_port)


def _to_ids(value: object) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise MalformedRequest("input_ids must be a sequence of token ids", param="input_ids")
    ids = tuple(value)
    # Checked at C speed (map, set, min, max): a request holds thousands of ids.
    if ids and (set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) > UINT32_MAX):
        raise MalformedRequest(
            f"input_ids must be integers in 0..{UINT32_MAX} (the wire's uint32)",
            param="input_ids",
        )
    return ids


def kv_params_text(value: object) -> str | None:
    """KV parameters as the text of a JSON object, kept verbatim when given as text.

    A mapping is serialised compactly. Raises ``MalformedRequest`` for anything
    that is not a JSON object, and for text that is not strict JSON (a key twice:
    the engine receives the text unchanged, and must not read it otherwise than
    the policy did).
    """
    if value is None:
        return None
    if isinstance(value, Mapping):
        try:
            return json.dumps(dict(value), separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError):
            raise MalformedRequest(
                "kv_transfer_params must be JSON-serialisable", param="kv_transfer_params"
            ) from None
    if not isinstance(value, str):
        raise MalformedRequest("kv_transfer_params must be a JSON object", "kv_transfer_params")
    parsed = loads_strict(value, what="kv_transfer_params", param="kv_transfer_params")
    if not isinstance(parsed, dict):
        raise MalformedRequest(
            "kv_transfer_params must be the text of a JSON object", param="kv_transfer_params"
        )
    return value


def _tuple_of(value: object, kind: type, param: str) -> tuple[Any, ...]:
    if not isinstance(value, Iterable) or isinstance(value, str | bytes | Mapping):
        raise MalformedRequest(f"{param} must be a sequence", param=param)
    items = tuple(value)
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            raise MalformedRequest(f"{param} must hold {kind.__name__}", f"{param}[{i}]")
    return items


def _to_batches(value: object) -> tuple[MultimodalBatch, ...]:
    return _tuple_of(value, MultimodalBatch, "batches")


def _to_media_refs(value: object) -> tuple[MediaRef, ...]:
    return _tuple_of(value, MediaRef, "media_refs")


def _to_n(value: object) -> int:
    if type(value) is not int or not 0 <= value <= UINT32_MAX:
        raise MalformedRequest(f"n must be an integer in 0..{UINT32_MAX}", param="n")
    # The wire reads 0 (unset) as one sample.
    return value or 1


def _check_request_id(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str):
        raise MalformedRequest("request_id must be a string", param="request_id")


@attrs.frozen(slots=True)
class Request:
    """A generation request, reduced to what the P/D policy reads and writes.

    Exactly one of ``input_ids`` (tokenized, with multimodal placeholders already
    expanded by the router) and ``text`` is set. ``batches`` are in wire order:
    the primary batch first, then the extras. ``kv_transfer_params`` is the text
    of a JSON object, kept verbatim (a mapping is accepted and serialised);
    ``kv_legacy`` is the legacy host/port handoff. ``cache_salt`` is the caller's
    own salt. A repr shows none of what an error never echoes either: the salt, the
    KV parameters (engine ids, hosts, transfer ids) and the legacy host; a batch's
    repr counts its content hashes instead of showing them.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] when a field is ill-typed or
    fields contradict each other: both or neither input, a placeholder past the
    end of ``input_ids``, placeholders on a text request, media references on a
    text request or together with batches.
    """

    request_id: str = attrs.field(validator=_check_request_id)
    input_ids: tuple[int, ...] | None = attrs.field(default=None, converter=_to_ids)
    text: str | None = attrs.field(default=None, validator=instance_of(str, optional=True))
    batches: tuple[MultimodalBatch, ...] = attrs.field(default=(), converter=_to_batches)
    media_refs: tuple[MediaRef, ...] = attrs.field(default=(), converter=_to_media_refs)
    n: int = attrs.field(default=1, converter=_to_n)
    kv_transfer_params: str | None = attrs.field(
        default=None, converter=kv_params_text, repr=redacted_repr
    )
    kv_legacy: LegacyKvParams | None = attrs.field(
        default=None, validator=instance_of(LegacyKvParams, optional=True), repr=redacted_repr
    )
    cache_salt: str | None = attrs.field(
        default=None, validator=instance_of(str, optional=True), repr=redacted_repr
    )

    def __attrs_post_init__(self) -> None:
        if (self.input_ids is None) == (self.text is None):
            raise MalformedRequest("set exactly one of input_ids and text", param="input_ids")
        if self.media_refs and self.batches:
            raise MalformedRequest(
                "media_refs cannot be combined with multimodal batches", param="media_refs"
            )
        if self.media_refs and self.input_ids is None:
            raise MalformedRequest("media_refs require tokenized input", param="media_refs")
        n_ids = -1 if self.input_ids is None else len(self.input_ids)
        for b, batch in enumerate(self.batches):
            for p, ph in enumerate(batch.placeholders):
                if ph.end > n_ids:
                    where = "runs past input_ids" if n_ids >= 0 else "needs tokenized input"
                    raise MalformedRequest(
                        f"placeholder [{ph.offset}, {ph.end}) {where} ({max(n_ids, 0)} ids)",
                        param=f"batches[{b}].placeholders[{p}]",
                    )

    # --- derived facts --------------------------------------------------------------

    @property
    def has_mm_inputs(self) -> bool:
        """True when any multimodal batch is present (media references do not count)."""
        return bool(self.batches)

    @property
    def has_kv_transfer_params(self) -> bool:
        """True when either wire form of the KV handoff is present."""
        return self.kv_transfer_params is not None or self.kv_legacy is not None

    @property
    def relays_kv(self) -> bool:
        """True when the KV handoff applies: it has a single consumer, so only for n<=1."""
        return self.n <= 1

    def kv_transfer_params_dict(self) -> dict[str, Any] | None:
        """The KV parameters parsed into a dict, or ``None``."""
        if self.kv_transfer_params is None:
            return None
        parsed: dict[str, Any] = json.loads(self.kv_transfer_params)
        return parsed

    def derive(self, **changes: Any) -> Request:
        """A copy with ``changes`` applied, validated like any new request."""
        return attrs.evolve(self, **changes)

    def _derive_trusted(self, **changes: Any) -> Request:
        # Legs are built from subsets of an already validated request, so re-running
        # every converter (an O(len(input_ids)) scan) would only cost time.
        new = object.__new__(Request)
        for name in _REQUEST_FIELDS:
            object.__setattr__(new, name, changes.get(name, getattr(self, name)))
        return new


#: The request's field names, read once (``attrs.fields`` looks them up on each call).
_REQUEST_FIELDS: Final = tuple(field.name for field in attrs.fields(Request))
