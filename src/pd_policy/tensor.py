"""Tensor descriptors: what the policy needs to know about a tensor, never its bytes.

The core decides; adapters move bytes. A descriptor records where a payload
lives so the policy can keep or drop it (only inline grids may ride an
identity-only leg: a shared-memory handle cannot serve two legs).
"""

from __future__ import annotations

import enum

import attrs

from .errors import MalformedRequest
from .fields import UINT32_MAX, instance_of

__all__ = ["PayloadLocation", "TensorDescriptor"]


class PayloadLocation(enum.Enum):
    """Where a tensor's payload lives."""

    #: Bytes travel inside the message.
    INLINE = "inline"
    #: A shared-memory handle on the worker's host.
    SHM = "shm"
    #: A handle to a remote tensor store.
    REMOTE = "remote"
    #: No payload at all (a key present with an empty tensor message).
    NONE = "none"


def _check_name(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise MalformedRequest("a tensor name must be a non-empty string", param="name")


def _to_shape(value: object) -> tuple[int, ...]:
    if not isinstance(value, tuple | list) or not all(
        type(d) is int and 0 <= d <= UINT32_MAX for d in value
    ):
        raise MalformedRequest(
            f"a tensor shape must be a sequence of integers in 0..{UINT32_MAX}", param="shape"
        )
    return tuple(value)


def _check_nbytes(inst: TensorDescriptor, _attr: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or value < 0:
        raise MalformedRequest("nbytes must be a non-negative integer", param="nbytes")


@attrs.frozen(slots=True)
class TensorDescriptor:
    """A tensor as the policy sees it: name, shape, dtype, payload location and size.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] if a field is ill-typed,
    or if a payload-less descriptor claims a size.
    """

    name: str = attrs.field(validator=_check_name)
    shape: tuple[int, ...] = attrs.field(converter=_to_shape)
    dtype: str = attrs.field(validator=instance_of(str))
    location: PayloadLocation = attrs.field(
        default=PayloadLocation.INLINE, validator=instance_of(PayloadLocation)
    )
    nbytes: int = attrs.field(default=0, validator=_check_nbytes)

    def __attrs_post_init__(self) -> None:
        if self.location is PayloadLocation.NONE and self.nbytes:
            raise MalformedRequest(
                f"tensor {self.name!r} has no payload but claims {self.nbytes} bytes",
                param="nbytes",
            )

    @property
    def is_inline(self) -> bool:
        """True when the payload travels inside the message."""
        return self.location is PayloadLocation.INLINE
