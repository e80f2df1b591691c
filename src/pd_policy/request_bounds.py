"""What one request may cost a router before any worker is called.

A router plans, names and places every media item of a request on its own loop: each item's
identity is hashed, scoped to its tenant and looked up, however small the item. A body of
hundreds of thousands of tiny ``data:`` images within the body cap would hold the loop (and
every other client) for seconds, so the items of one request are capped, and the cap is
checked before any per-item work. vLLM's own default is 999 items per modality; a router
refuses far fewer by default, since it pays for each before any worker does. The messages
and content parts the router walks on every attempt are capped too, far higher: a text
part costs a walk, not a hash.
"""

from __future__ import annotations

from typing import Final

from .client_errors import TooManyMediaItems, TooManyParts

__all__ = ["DEFAULT_MAX_MEDIA_ITEMS", "DEFAULT_MAX_PARTS", "check_media_items", "check_parts"]

#: The most media items (images, videos and audio clips together) one request may hold, by
#: default.
DEFAULT_MAX_MEDIA_ITEMS: Final = 128


def check_media_items(count: int, limit: int = DEFAULT_MAX_MEDIA_ITEMS) -> None:
    """Raise [`TooManyMediaItems`][pd_policy.client_errors.TooManyMediaItems] (400) when a
    request holds ``count`` media items, more than ``limit``. A caller counts items only up
    to ``limit + 1``: past it, the exact number is no one's business."""
    if count > limit:
        raise TooManyMediaItems(
            f"the request holds more than {limit} media items, the most this router takes",
            param="messages",
        )


#: The most messages and content parts (together) one request may hold, by default: far
#: above any conversation's, and few enough that the router's walks over them, on every
#: attempt, take milliseconds.
DEFAULT_MAX_PARTS: Final = 16384


def check_parts(count: int, limit: int = DEFAULT_MAX_PARTS) -> None:
    """Raise [`TooManyParts`][pd_policy.client_errors.TooManyParts] (400) when a request
    holds ``count`` messages and content parts together, more than ``limit``."""
    if count > limit:
        raise TooManyParts(
            f"the request holds more than {limit} messages and content parts, the most this "
            "router takes",
            param="messages",
        )
