"""The fields only a router may set: each refused or dropped as its row says, wherever it sits,
whatever its value, and nothing else touched."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd_policy import (
    ROUTER_FIELDS,
    OnClient,
    RouterOwnedField,
    TooManyMediaItems,
    check_client_fields,
)
from pd_policy.request_bounds import DEFAULT_MAX_MEDIA_ITEMS, check_media_items
from pd_policy.router_fields import router_fields_in, without_dropped

_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=5),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)  # fmt: skip
_OTHER_KEYS = st.text(max_size=8).filter(lambda k: k not in {f.path[0] for f in ROUTER_FIELDS})


def _with(body: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = dict(body)
    if len(path) == 1:
        out[path[0]] = value
    else:
        out[path[0]] = {**out.get(path[0], {}), path[1]: value}
    return out


@pytest.mark.parametrize("field", ROUTER_FIELDS, ids=lambda f: f.name)
def test_each_field_is_refused_or_dropped_as_its_row_says(field: Any) -> None:
    body = _with({"model": "m", "messages": []}, field.path, {"remote_host": "10.0.0.1"})
    if field.on_client is OnClient.REFUSE:
        with pytest.raises(RouterOwnedField) as caught:
            check_client_fields(body)
        assert caught.value.param == field.name
        assert caught.value.status == 400 and not caught.value.retryable
        assert "10.0.0.1" not in caught.value.message
    else:
        assert check_client_fields(body) == (field,)
        assert field.path[0] not in without_dropped(body, (field,))


def test_a_null_value_is_still_the_field() -> None:
    with pytest.raises(RouterOwnedField):
        check_client_fields({"kv_transfer_params": None})


def test_the_extension_args_own_keys_are_the_routers_and_the_rest_the_clients() -> None:
    assert check_client_fields({"vllm_xargs": {"my_processor": 3}}) == ()
    with pytest.raises(RouterOwnedField) as caught:
        check_client_fields({"vllm_xargs": {"my_processor": 3, "kv_transfer_params": "x"}})
    assert caught.value.param == "vllm_xargs.kv_transfer_params"
    # Not an object: vLLM refuses it itself; nothing of the router's is in it.
    assert check_client_fields({"vllm_xargs": ["kv_transfer_params"]}) == ()


def test_a_body_that_is_not_an_object_holds_none() -> None:
    bodies: list[object] = [[], "kv_transfer_params", None, 3]
    for body in bodies:
        assert router_fields_in(body) == ()


def test_dropped_fields_are_top_level_where_without_dropped_reaches_them() -> None:
    assert all(len(f.path) == 1 for f in ROUTER_FIELDS if f.on_client is OnClient.DROP)


@given(
    st.dictionaries(_OTHER_KEYS, _VALUES, max_size=4),
    st.lists(st.sampled_from(ROUTER_FIELDS), max_size=3),
    _VALUES,
)
def test_refused_exactly_when_a_refused_field_is_present(
    base: dict[str, Any], fields: list[Any], value: Any
) -> None:
    body = base
    for field in fields:
        body = _with(body, field.path, value)
    refused = [f for f in fields if f.on_client is OnClient.REFUSE]
    if refused:
        with pytest.raises(RouterOwnedField) as caught:
            check_client_fields(body)
        assert caught.value.param in {f.name for f in refused}
        return
    dropped = check_client_fields(body)
    assert set(dropped) == set(fields)
    kept = without_dropped(body, dropped)
    assert kept == base  # nothing else touched
    assert body == _with_all(base, fields, value)  # the caller's body unchanged


def _with_all(base: dict[str, Any], fields: list[Any], value: Any) -> dict[str, Any]:
    for field in fields:
        base = _with(base, field.path, value)
    return base


def test_a_request_holds_at_most_the_cap_of_media_items() -> None:
    check_media_items(DEFAULT_MAX_MEDIA_ITEMS)
    check_media_items(3, limit=3)
    with pytest.raises(TooManyMediaItems) as caught:
        check_media_items(4, limit=3)
    assert caught.value.status == 400 and caught.value.code == "pd_too_many_media_items"
