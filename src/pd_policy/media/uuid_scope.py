"""Whose name a client's media ``uuid`` is: an item's name only within its tenant.

vLLM takes a content part's ``uuid`` (``multi_modal_uuids`` offline) as the item's
hash and keys its caches by it, across every request: ``cache_salt`` does not scope
it. So a tenant that sends another tenant's uuid with other bytes is answered as the
other's item, with a 200, by a plain ``vllm serve`` too, and learns what that item
showed. A router in front of vLLM closes this by never forwarding a client's uuid as
it came: [`forwarded_uuid`][pd_policy.media.uuid_scope.forwarded_uuid] makes it a SHA-256
of the request's [`Tenant`][pd_policy.media.uuid_scope.Tenant] and the uuid.

Why namespacing, and not the content's hash in place of the uuid:

* a uuid alone (a part with no data) names an item the client sent earlier; the
  router has no bytes to hash then, and the prefill's cache holds the item under the
  name the earlier request forwarded. Replacing a sent uuid by the bytes' hash would
  leave every such reference naming nothing; a remote URL's bytes the router does not
  see at all. Namespacing is one rule for every uuid, whatever the part holds.
* two tenants' names can never meet: the tenant is inside the hash, so tenants that
  send one uuid forward two names, and a uuid that looks like a forwarded one is
  hashed again like any other (every uuid a client sends is hashed; none is passed
  on), so no tenant can write another's forwarded name without inverting SHA-256.
* within one tenant a uuid keeps vLLM's meaning: the client's promise that one name
  is one item, which it makes about its own requests alone. A cache hit across its
  requests is kept (one tenant, one uuid, one forwarded name).

The tenant is what separates clients' caches: the request's ``cache_salt`` and the
API key the router admitted, each when there is one (neither: the anonymous tenant).
The key enters only as a SHA-256 of it, so no tenant, repr or forwarded name holds or
reveals a key. ``ClientUuids.TRUSTED`` forwards uuids as sent (vLLM's own behaviour),
for an operator whose clients are one tenant.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Final

import attrs

from ..errors import MalformedRequest
from ..fields import instance_of

__all__ = ["ANONYMOUS", "SCOPED_UUID_PREFIX", "ClientUuids", "Tenant", "forwarded_uuid"]

#: Prefix of every uuid this module forwards; a change of encoding gets a new one.
SCOPED_UUID_PREFIX: Final = "pdu1:"
_TENANT_DOMAIN: Final = b"pd-policy/tenant/v1\x00"
_KEY_DOMAIN: Final = b"pd-policy/api-key/v1\x00"
_UUID_DOMAIN: Final = b"pd-policy/scoped-uuid/v1\x00"
_HEX: Final = frozenset("0123456789abcdef")


class ClientUuids(enum.Enum):
    """What a router does with the ``uuid`` a client gives a media item."""

    #: Forward it namespaced by the request's tenant (the default).
    SCOPED = "scoped"
    #: Forward it as sent: every client's uuids share one namespace, as on vLLM.
    TRUSTED = "trusted"


def _field(present: bool, text: str = "") -> bytes:
    # A presence tag, then the length-prefixed UTF-8: "no salt" is not the salt "", and
    # no byte of one field can pass for another's.
    raw = text.encode("utf-8", "surrogatepass")
    return (b"\x01" if present else b"\x00") + len(raw).to_bytes(8, "big") + raw


def _check_digest(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if len(value) != 64 or not _HEX.issuperset(value):
        raise MalformedRequest(f"{attribute.name} must be 64 lowercase hex digits", attribute.name)


@attrs.frozen(slots=True)
class Tenant:
    """Whose a request's client uuids are: a digest of its ``cache_salt`` and of the API
    key the router admitted it with ([`of`][pd_policy.media.uuid_scope.Tenant.of]). Two
    requests are one tenant exactly when both are equal (each present or each absent).
    It holds no key and no salt, only the digest; its repr shows neither."""

    digest: str = attrs.field(validator=[instance_of(str), _check_digest], repr=False)

    @classmethod
    def of(cls, *, cache_salt: str | None = None, api_key: str | None = None) -> Tenant:
        """The tenant of a request with ``cache_salt`` (``None``: the body has none) that
        the router admitted with ``api_key`` (``None``: it takes any client). Raises
        [`MalformedRequest`][pd_policy.errors.MalformedRequest] for a salt or key that
        is not a string."""
        _Given(cache_salt, api_key)
        h = hashlib.sha256(_TENANT_DOMAIN)
        h.update(_field(cache_salt is not None, cache_salt or ""))
        key = (
            hashlib.sha256(_KEY_DOMAIN + api_key.encode("utf-8", "surrogatepass")).hexdigest()
            if api_key is not None
            else ""
        )
        h.update(_field(api_key is not None, key))
        return cls(h.hexdigest())


@attrs.frozen(slots=True)
class _Given:
    cache_salt: str | None = attrs.field(validator=instance_of(str, optional=True))
    api_key: str | None = attrs.field(validator=instance_of(str, optional=True), repr=False)


#: The tenant of a request with neither a salt nor an admitted key.
ANONYMOUS: Final = Tenant.of()


def forwarded_uuid(uuid: str, tenant: Tenant, mode: ClientUuids = ClientUuids.SCOPED) -> str:
    """The uuid a router forwards for a client's ``uuid`` in a request of ``tenant``:
    ``"pdu1:"`` and 64 hex digits, a SHA-256 of the tenant and the uuid; ``uuid`` itself
    when ``mode`` is ``TRUSTED``.

    Equal exactly when the tenant and the uuid are equal (for ``SCOPED``): one tenant's
    repeated uuid still names one item, and no uuid of one tenant, whatever it looks
    like, is forwarded as a name another tenant's uuid is. Raises
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] for a ``uuid``, ``tenant`` or
    ``mode`` of another type.
    """
    _Scoping(uuid, tenant, mode)
    if mode is ClientUuids.TRUSTED:
        return uuid
    h = hashlib.sha256(_UUID_DOMAIN)
    h.update(bytes.fromhex(tenant.digest))
    h.update(_field(True, uuid))
    return SCOPED_UUID_PREFIX + h.hexdigest()


@attrs.frozen(slots=True)
class _Scoping:
    uuid: str = attrs.field(validator=instance_of(str), repr=False)
    tenant: Tenant = attrs.field(validator=instance_of(Tenant))
    mode: ClientUuids = attrs.field(validator=instance_of(ClientUuids))
