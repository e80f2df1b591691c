"""What a gRPC router checks of a caller's request before any work on it or call for it.

Every router of this package admits a request first, on the first iteration of its
``generate``: the media-item cap ([`media_items`][pd_policy_grpc.media_items]), counted
before any item is read, and then the fields only the router may set
([`owned`][pd_policy_grpc.owned]). A refusal is the typed 400 the caller's iteration
raises, as every policy error is (a gRPC-facing router aborts with its
[`grpc_status`][pd_policy_grpc.status.grpc_status]); no worker has been called.
[`admit_raw`][pd_policy_grpc.raw.admission.admit_raw] is the same on bytes.
"""

from __future__ import annotations

from .media_items import check_message_media_items
from .owned import check_message
from .wire import pb

__all__ = ["admit_message"]


def admit_message(request: pb.GenerateRequest, max_media_items: int) -> pb.GenerateRequest:
    """``request``, once admitted. Raises
    [`TooManyMediaItems`][pd_policy.client_errors.TooManyMediaItems] for more than
    ``max_media_items`` media items, then
    [`RouterOwnedField`][pd_policy.client_errors.RouterOwnedField] for a field only the
    router may set (both 400)."""
    check_message_media_items(request, max_media_items)
    check_message(request)
    return request
