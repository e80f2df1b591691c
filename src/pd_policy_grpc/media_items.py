"""How many media items a ``GenerateRequest`` holds, counted before any per-item work.

A router hashes, scopes, looks up and places every item of a request on its own loop
([`request_bounds`][pd_policy.request_bounds]): the count is checked first, from the
sizes of the repeated fields alone (never an item read), and only up to the cap and one
more. A media reference is one item; a batch is as many as it names (content hashes or
placeholder ranges, whichever are more), and at least one: a batch costs its own work
whether or not it names any. The count on bytes
([`Tally`][pd_policy_grpc.raw.items.Tally]) is the same number, under the wire's merge
rules.
"""

from __future__ import annotations

from pd_policy.request_bounds import check_media_items

from .wire import pb

__all__ = ["check_message_media_items", "count_media_items"]


def count_media_items(request: pb.GenerateRequest, limit: int) -> int:
    """The media items of ``request``, counted up to ``limit + 1`` (past it, the count
    stops: the request is refused whatever its exact number)."""
    count = len(request.media_refs.items) if request.HasField("media_refs") else 0
    if count > limit:
        return count
    if request.HasField("mm_inputs"):
        primary = request.mm_inputs
        count += max(1, len(primary.mm_hashes), len(primary.mm_placeholders))
    extras = request.extra_mm_inputs
    if count + len(extras) > limit:
        return count + len(extras)  # each batch is at least one item
    for extra in extras:
        count += max(1, len(extra.mm_hashes), len(extra.mm_placeholders))
        if count > limit:
            break
    return count


def check_message_media_items(request: pb.GenerateRequest, limit: int) -> None:
    """Raise [`TooManyMediaItems`][pd_policy.client_errors.TooManyMediaItems] (400) when
    ``request`` holds more than ``limit`` media items."""
    check_media_items(count_media_items(request, limit), limit)
