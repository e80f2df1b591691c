"""A client's media uuid names an item only within its tenant: the core's rule.

The attack: tenant y sends tenant x's uuid (or a uuid built to look like what x's was
forwarded as) with another image, and vLLM, which keys its caches by the forwarded
uuid, answers y as x's image. Each property is over generated tenants and uuids,
adversarial strings included.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pd_policy import (
    ANONYMOUS,
    SCOPED_UUID_PREFIX,
    ClientUuids,
    MalformedRequest,
    Tenant,
    forwarded_uuid,
)
from strategies import adversarial_text

TEXT = st.one_of(adversarial_text, st.text(max_size=40))
TENANTS = st.builds(
    lambda salt, key: Tenant.of(cache_salt=salt, api_key=key),
    st.none() | TEXT,
    st.none() | TEXT,
)


@given(TENANTS, TENANTS, TEXT)
def test_two_tenants_never_forward_one_uuid_as_one_name(x: Tenant, y: Tenant, uuid: str) -> None:
    assume(x != y)
    assert forwarded_uuid(uuid, x) != forwarded_uuid(uuid, y)


@given(st.none() | TEXT, st.none() | TEXT, TEXT)
def test_one_tenant_forwards_one_uuid_as_one_name(
    salt: str | None, key: str | None, uuid: str
) -> None:
    # The cache still hits for the tenant that named the item: the same tenant, made
    # again from the same request fields, forwards the same name.
    first = forwarded_uuid(uuid, Tenant.of(cache_salt=salt, api_key=key))
    assert first == forwarded_uuid(uuid, Tenant.of(cache_salt=salt, api_key=key))
    assert first.startswith(SCOPED_UUID_PREFIX) and len(first) == len(SCOPED_UUID_PREFIX) + 64


@given(TENANTS, TEXT, TEXT)
def test_one_tenant_two_uuids_are_two_names(tenant: Tenant, a: str, b: str) -> None:
    assume(a != b)
    assert forwarded_uuid(a, tenant) != forwarded_uuid(b, tenant)


@given(TENANTS, TENANTS, TEXT, st.sampled_from(["", " ", "\n", "x"]))
def test_no_tenant_can_send_a_uuid_forwarded_as_anothers(
    x: Tenant, y: Tenant, uuid: str, noise: str
) -> None:
    # y knows x's uuid and what it was forwarded as (a worker's log, say) and sends that,
    # or a near spelling of it: every uuid y sends is hashed again, none passed on.
    assume(x != y)
    target = forwarded_uuid(uuid, x)
    for forged in (target, target + noise, noise + target, target.upper(),
                   target.removeprefix(SCOPED_UUID_PREFIX), uuid):  # fmt: skip
        assert forwarded_uuid(forged, y) != target


def test_the_tenant_is_the_salt_and_the_key_each_when_present() -> None:
    tenants = [
        ANONYMOUS,
        Tenant.of(cache_salt=""),  # a salt, though empty, is not "no salt"
        Tenant.of(api_key=""),
        Tenant.of(cache_salt="a"),
        Tenant.of(api_key="a"),  # a key is not the salt of the same text
        Tenant.of(cache_salt="a", api_key="a"),
        Tenant.of(cache_salt="a", api_key="b"),
        Tenant.of(cache_salt="b", api_key="a"),
    ]
    assert len({t.digest for t in tenants}) == len(tenants)
    assert Tenant.of() == ANONYMOUS


def test_a_tenant_holds_no_key_and_shows_no_salt() -> None:
    key, salt = "sk-very-secret-0123456789", "salt-of-tenant-x"
    tenant = Tenant.of(cache_salt=salt, api_key=key)
    for shown in (repr(tenant), str(tenant), tenant.digest,
                  forwarded_uuid("u", tenant)):  # fmt: skip
        assert key not in shown and salt not in shown
    assert repr(tenant) == "Tenant()"


def test_trusted_uuids_are_forwarded_as_sent() -> None:
    x, y = Tenant.of(cache_salt="x"), Tenant.of(cache_salt="y")
    assert (
        forwarded_uuid("u", x, ClientUuids.TRUSTED)
        == "u"
        == forwarded_uuid("u", y, ClientUuids.TRUSTED)
    )
    assert forwarded_uuid("u", x) == forwarded_uuid("u", x, ClientUuids.SCOPED) != "u"


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda: forwarded_uuid(7, ANONYMOUS), "uuid"),  # type: ignore[arg-type]
        (lambda: forwarded_uuid("u", "tenant"), "tenant"),  # type: ignore[arg-type]
        (lambda: forwarded_uuid("u", ANONYMOUS, "scoped"), "mode"),  # type: ignore[arg-type]
        (lambda: Tenant.of(cache_salt=3), "cache_salt"),  # type: ignore[arg-type]
        (lambda: Tenant.of(api_key=b"k"), "api_key"),  # type: ignore[arg-type]
        (lambda: Tenant("ab"), "digest"),
        (lambda: Tenant("G" * 64), "digest"),
    ],
)
def test_ill_typed_inputs_are_typed_errors(call: Any, param: str) -> None:
    with pytest.raises(MalformedRequest) as caught:
        call()
    assert caught.value.param == param
