"""[`admit_message`][pd_policy_grpc.admission.admit_message] on serialized requests: the
media-item cap counted from the tags before anything is parsed, and the router's fields
found by their field numbers, on the wire as the worker would receive them."""

from __future__ import annotations

from pd_policy.request_bounds import check_media_items
from pd_policy_grpc.facts import check_generate_request
from pd_policy_grpc.owned import check_numbers

from .reader import RawRequest, read_request

__all__ = ["admit_raw", "read_admitted"]


def admit_raw(request: RawRequest, max_media_items: int) -> RawRequest:
    """A read ``request``, once admitted (it may have been read under a larger cap).
    Raises as [`admit_message`][pd_policy_grpc.admission.admit_message] does."""
    check_media_items(request.media_items, max_media_items)
    check_numbers(field.number for field in request.fields)
    return request


def read_admitted(
    data: bytes | bytearray | memoryview | RawRequest, max_media_items: int
) -> RawRequest:
    """``data`` read (unless it already is) and admitted; raises as
    [`read_request`][pd_policy_grpc.raw.reader.read_request] and
    [`admit_raw`][pd_policy_grpc.raw.admission.admit_raw] do, the router's fields refused
    before the message is checked (as on messages: a caller's handoff is refused as such,
    whatever its value)."""
    if isinstance(data, RawRequest):
        return admit_raw(data, max_media_items)
    request = admit_raw(
        read_request(data, check=False, max_media_items=max_media_items), max_media_items
    )
    check_generate_request(request.skeleton)
    return request
