"""One multimodal batch: the items of one modality, as the SMG wire batch carries them."""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from .errors import MalformedRequest
from .fields import count_repr, instance_of, uint32
from .tensor import TensorDescriptor

__all__ = ["Modality", "MultimodalBatch", "PlaceholderRange"]


class Modality(enum.Enum):
    """The modality of a batch or media reference. An unspecified modality means image."""

    IMAGE = "image"
    AUDIO = "audio"
    VIDEO = "video"


@attrs.frozen(slots=True)
class PlaceholderRange:
    """Where one item's placeholder tokens sit in ``input_ids``: ``[offset, offset+length)``.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] for an offset or a length that
    is not a ``uint32``, or a length below one.
    """

    offset: int = attrs.field(validator=uint32())
    length: int = attrs.field(validator=uint32())

    def __attrs_post_init__(self) -> None:
        if self.length == 0:
            raise MalformedRequest("a placeholder range must cover at least one token", "length")

    @property
    def end(self) -> int:
        """One past the last placeholder token."""
        return self.offset + self.length


def _str_tuple(value: object, param: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise MalformedRequest(f"{param} must be a sequence of strings", param=param)
    items = tuple(value)
    if not all(isinstance(v, str) for v in items):
        raise MalformedRequest(f"{param} must be a sequence of strings", param=param)
    return items


def _to_batched_keys(value: object) -> tuple[str, ...]:
    return _str_tuple(value, "batched_keys")


def _to_keep_on_cpu_keys(value: object) -> tuple[str, ...]:
    return _str_tuple(value, "keep_on_cpu_keys")


def _to_hashes(value: object) -> tuple[str, ...]:
    hashes = _str_tuple(value, "mm_hashes")
    for i, h in enumerate(hashes):
        if not h:
            raise MalformedRequest("a content hash must not be empty", param=f"mm_hashes[{i}]")
    return hashes


def _to_tensors(value: object) -> tuple[TensorDescriptor, ...]:
    if isinstance(value, Mapping):
        value = value.values()
    if not isinstance(value, Iterable):
        raise MalformedRequest("tensors must be a sequence of tensor descriptors", "tensors")
    items = tuple(value)
    for t in items:
        if not isinstance(t, TensorDescriptor):
            raise MalformedRequest("tensors must be a sequence of tensor descriptors", "tensors")
    # Wire maps are unordered: a canonical order makes equal batches compare equal.
    ordered = tuple(sorted(items, key=lambda t: t.name))
    for a, b in itertools.pairwise(ordered):
        if a.name == b.name:
            raise MalformedRequest(f"tensor {a.name!r} appears twice", param="tensors")
    return ordered


def _to_flat_keys(value: object) -> tuple[tuple[str, str], ...]:
    if isinstance(value, Mapping):
        value = value.items()
    if not isinstance(value, Iterable):
        raise MalformedRequest("flat_keys must map tensor names to names", param="flat_keys")
    pairs = tuple(value)
    for p in pairs:
        if not (isinstance(p, tuple) and len(p) == 2 and all(isinstance(x, str) for x in p)):
            raise MalformedRequest("flat_keys must map tensor names to names", "flat_keys")
    ordered = tuple(sorted(pairs))
    if len({k for k, _ in ordered}) != len(ordered):
        raise MalformedRequest("flat_keys maps one tensor twice", param="flat_keys")
    return ordered


def _to_placeholders(value: object) -> tuple[PlaceholderRange, ...]:
    if not isinstance(value, Iterable):
        raise MalformedRequest("placeholders must be a sequence", param="placeholders")
    items = tuple(value)
    if not all(isinstance(p, PlaceholderRange) for p in items):
        raise MalformedRequest("placeholders must be PlaceholderRange", "placeholders")
    return items


@attrs.frozen(slots=True)
class MultimodalBatch:
    """The items of one modality, with everything the SMG wire batch carries.

    ``tensors`` holds the model-specific tensors (M-RoPE grids such as
    ``image_grid_thw`` live here), kept in name order; ``flat_keys`` maps a
    flattened tensor to its sizes tensor. ``mm_hashes`` are per-item content
    hashes, in item order: they are the identity of the media, and the only part
    of a batch a language-model-only decode leg keeps.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] for ill-typed fields, an
    empty hash, a tensor named twice, a pixel tensor not named ``pixel_values``,
    or a placeholder count that differs from a non-empty hash count.
    """

    modality: Modality = attrs.field(default=Modality.IMAGE, validator=instance_of(Modality))
    pixel_values: TensorDescriptor | None = attrs.field(
        default=None, validator=instance_of(TensorDescriptor, optional=True)
    )
    tensors: tuple[TensorDescriptor, ...] = attrs.field(default=(), converter=_to_tensors)
    placeholders: tuple[PlaceholderRange, ...] = attrs.field(default=(), converter=_to_placeholders)
    mm_hashes: tuple[str, ...] = attrs.field(default=(), converter=_to_hashes, repr=count_repr)
    im_token_id: int | None = attrs.field(default=None, validator=uint32(optional=True))
    batched_keys: tuple[str, ...] = attrs.field(default=(), converter=_to_batched_keys)
    flat_keys: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_to_flat_keys)
    keep_on_cpu_keys: tuple[str, ...] = attrs.field(default=(), converter=_to_keep_on_cpu_keys)
    encoder_input_key: str | None = attrs.field(
        default=None, validator=instance_of(str, optional=True)
    )

    def __attrs_post_init__(self) -> None:
        if self.pixel_values is not None and self.pixel_values.name != "pixel_values":
            raise MalformedRequest("the pixel tensor must be named 'pixel_values'", "pixel_values")
        if self.placeholders and self.mm_hashes and len(self.placeholders) != len(self.mm_hashes):
            raise MalformedRequest(
                f"{len(self.placeholders)} placeholders but {len(self.mm_hashes)} hashes: "
                "each item has one of each",
                param="mm_hashes",
            )

    @property
    def tensor_names(self) -> tuple[str, ...]:
        """Names of the model-specific tensors, in name order."""
        return tuple(t.name for t in self.tensors)

    def tensor(self, name: str) -> TensorDescriptor | None:
        """The model-specific tensor called ``name``, or ``None``."""
        for t in self.tensors:
            if t.name == name:
                return t
        return None

    @property
    def carries_payload(self) -> bool:
        """True when the batch carries pixels or any model-specific tensor."""
        return self.pixel_values is not None or bool(self.tensors)

    def hashes_only(self) -> MultimodalBatch:
        """This batch reduced to its modality and content hashes (every other field at its
        default), made without running the constructor's checks again: both fields were
        checked when this batch was made, and no other is set."""
        new = object.__new__(MultimodalBatch)
        for name, value in _DEFAULTS:
            object.__setattr__(new, name, value)
        object.__setattr__(new, "modality", self.modality)
        object.__setattr__(new, "mm_hashes", self.mm_hashes)
        return new

    @property
    def is_hash_identity(self) -> bool:
        """True when the batch holds nothing but hashes and a modality (a stripped batch)."""
        return self == MultimodalBatch(modality=self.modality, mm_hashes=self.mm_hashes)


#: Every field's default, read once: a stripped batch sets them without the constructor.
_DEFAULTS: Final = tuple((f.name, f.default) for f in attrs.fields(MultimodalBatch))
