"""How a decode worker takes the prefill's KV, and whether a stripped leg can trust it.

A stripped multimodal decode leg (``TEXT_PLUS_HASHES``, or ``MROPE_METADATA`` with
media) carries no pixels: the decode answers with the image in mind only by loading
the prefill's KV. It gets that KV only when its connector loads *the transfer the
handoff names* (NIXL's blocks, a transfer id). Otherwise it recomputes, image-blind,
and answers 200:

* a connector that looks blocks up by **content hash** (an offloading tier, a KV
  store) hashes the stripped leg under another salt and without the media's
  identifiers, so it finds none of the prefill's blocks;
* a decode with **no** connector (or one that moves no KV between engines) loads
  nothing;
* a decode whose ``kv_transfer_config.kv_load_failure_policy`` is ``"recompute"``
  (vLLM's default is ``"fail"``) recomputes when a transfer fails.

[`DecodeKv`][pd_policy.decode_kv.DecodeKv] holds the two facts;
[`sequential_pd_decode_form`][pd_policy.decision.sequential_pd_decode_form] refuses a
stripped multimodal leg for a decode that could answer it blind
([`MediaOnBlindDecode`][pd_policy.wire_errors.MediaOnBlindDecode]), so a router picks
another decode. Text legs are not affected: their KV is the same, hit or miss.
"""

from __future__ import annotations

import enum
from typing import Final

import attrs

from .fields import instance_of

__all__ = [
    "KV_LOAD_FAILURE_LABEL",
    "KV_LOAD_LABEL",
    "DecodeKv",
    "KvLoad",
    "LoadFailure",
]

#: Worker label that says how its connector loads KV (``request``, ``content``, ``none``).
KV_LOAD_LABEL: Final = "kv_load"
#: Worker label that carries its ``kv_load_failure_policy`` (``fail``, ``recompute``).
KV_LOAD_FAILURE_LABEL: Final = "kv_load_failure_policy"


class KvLoad(enum.Enum):
    """How a decode worker's KV connector finds the prefill's KV."""

    #: It loads the transfer the handoff names (NIXL's blocks, a transfer id).
    BY_REQUEST = "request"
    #: It looks blocks up by their content hash, which a stripped leg does not share.
    BY_CONTENT = "content"
    #: It loads nothing another engine made: no connector, or one that is no handoff.
    NONE = "none"
    #: Not said (a worker that does not describe itself): trusted, as before.
    UNKNOWN = "unknown"


class LoadFailure(enum.Enum):
    """What a decode does when its KV fails to load (``kv_load_failure_policy``)."""

    #: The request fails with an error (vLLM's default).
    FAIL = "fail"
    #: The failed blocks are recomputed from the leg as sent: image-blind for a stripped leg.
    RECOMPUTE = "recompute"
    UNKNOWN = "unknown"


_LOADS: Final = {k.value: k for k in KvLoad if k is not KvLoad.UNKNOWN}
_FAILURES: Final = {f.value: f for f in LoadFailure if f is not LoadFailure.UNKNOWN}


@attrs.frozen(slots=True)
class DecodeKv:
    """How a decode worker takes KV: ``loads`` and ``on_failure``, ``UNKNOWN`` each when the
    worker does not say (it keeps the behaviour of a worker described by
    ``supports_vision`` alone)."""

    loads: KvLoad = attrs.field(default=KvLoad.UNKNOWN, validator=instance_of(KvLoad))
    on_failure: LoadFailure = attrs.field(
        default=LoadFailure.UNKNOWN, validator=instance_of(LoadFailure)
    )

    @property
    def blind_to_stripped_media(self) -> bool:
        """Whether a stripped multimodal leg could be answered image-blind here: the
        connector matches by content hash or loads nothing, or a failed load is
        recomputed."""
        return (
            self.loads in (KvLoad.BY_CONTENT, KvLoad.NONE)
            or self.on_failure is LoadFailure.RECOMPUTE
        )

    @classmethod
    def from_labels(cls, loads: str | None, on_failure: str | None) -> DecodeKv:
        """From the values of [`KV_LOAD_LABEL`][pd_policy.decode_kv.KV_LOAD_LABEL] and
        [`KV_LOAD_FAILURE_LABEL`][pd_policy.decode_kv.KV_LOAD_FAILURE_LABEL]: only the exact
        values count, anything else (or none) is ``UNKNOWN``."""
        return cls(
            _LOADS.get(loads or "", KvLoad.UNKNOWN),
            _FAILURES.get(on_failure or "", LoadFailure.UNKNOWN),
        )

    def to_labels(self) -> dict[str, str]:
        """The labels [`from_labels`][pd_policy.decode_kv.DecodeKv.from_labels] reads back."""
        labels = {}
        if self.loads is not KvLoad.UNKNOWN:
            labels[KV_LOAD_LABEL] = self.loads.value
        if self.on_failure is not LoadFailure.UNKNOWN:
            labels[KV_LOAD_FAILURE_LABEL] = self.on_failure.value
        return labels
