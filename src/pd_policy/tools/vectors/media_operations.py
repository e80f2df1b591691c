"""The conformance operations of media identity: an item's identity, and a media URL checked
against a worker's rules.

* ``media_identity``: the basis the rule gives an item (its ``modality``, ``source``,
  whether it has a ``uuid``, was ``pinned`` or named by the worker that fetched it) and
  its identity for a ``value`` and the hash ``factors``;
* ``check_media_url``: the source of a ``url`` the worker would read under ``rules``
  (``allowed_domains``, ``allowed_local_path``), or the refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeVar

from pd_policy.batch import Modality
from pd_policy.errors import MalformedRequest, PolicyError
from pd_policy.media.identity import HashFactors, MediaSource, identity_basis, item_identity
from pd_policy.media.rules import MediaFetchRules, check_media_url

from .reading import error, field, opt_field

__all__ = ["MEDIA_OPERATIONS"]

E = TypeVar("E", Modality, MediaSource)
_FACTORS: Final = (
    "processor_kwargs",
    "media_io_kwargs",
    "worker_processor_kwargs",
    "worker_media_io_kwargs",
)


def _enum(case: Mapping[str, Any], key: str, kind: type[E]) -> E:
    try:
        return kind(field(case, key, str))
    except ValueError:
        raise MalformedRequest(f"an unknown {key}", param=key) from None


def _identity_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    modality, source = _enum(case, "modality", Modality), _enum(case, "source", MediaSource)
    flags = {k: field(case, k, bool, default=False) for k in ("has_uuid", "pinned", "worker")}
    factors = field(case, "factors", dict, default={})
    unknown = sorted(set(factors) - set(_FACTORS))
    if unknown:
        raise MalformedRequest("unknown field", param=f"factors.{unknown[0]}")
    try:
        basis = identity_basis(
            source,
            has_uuid=flags["has_uuid"],
            pinned=flags["pinned"],
            worker_hashes=flags["worker"],
        )
        kwargs = {k: opt_field(factors, k, dict) for k in _FACTORS}
        identity = item_identity(modality, basis, field(case, "value", str), HashFactors(**kwargs))
    except PolicyError as exc:
        return error(exc)
    return {"status": 200, "basis": basis.value, "identity": identity}


def _url_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    rules = field(case, "rules", dict, default={})
    try:
        worker = MediaFetchRules(
            allowed_domains=opt_field(rules, "allowed_domains", list),
            allowed_local_path=opt_field(rules, "allowed_local_path", str),
        )
        source = check_media_url(field(case, "url", str), worker, param="url")
    except PolicyError as exc:
        return error(exc)
    return {"status": 200, "source": source.value}


#: The media operations, by name.
MEDIA_OPERATIONS: Final = {
    "media_identity": _identity_outcome,
    "check_media_url": _url_outcome,
}
