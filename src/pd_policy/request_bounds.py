"""What one request may cost a router before any worker is called.

A router plans, names and places every media item of a request on its own loop: each item's
identity is hashed, scoped to its tenant and looked up, however small the item. A body of
hundreds of thousands of tiny ``data:`` images within the body cap would hold the loop (and
every other client) for seconds, so the items of one request are capped, and the cap is
checked before any per-item work. vLLM's own default is 999 items per modality; a router
refuses far fewer by default, since it pays for each before any worker does.
"""

from __future__ import annotations

from typing import Final

from .client_errors import TooManyMediaItems

__all__ = ["DEFAULT_MAX_MEDIA_ITEMS", "check_media_items"]

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
