"""The conformance cases of what a client may send: each router's field refused or dropped,
at the top level and in ``vllm_xargs``, with every kind of value; a body with none; and the
media items' cap at its edge."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from pd_policy.router_fields import ROUTER_FIELDS

__all__ = ["client_cases"]

_HANDOFF: Final = {"do_remote_prefill": True, "remote_host": "10.0.0.9", "remote_port": 5600}


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if len(path) == 1:
        body[path[0]] = value
    else:
        body[path[0]] = {"my_extension": 1, path[1]: value}
    return body


def client_cases(add: Callable[..., None]) -> None:
    """Append the cases, through ``add(case_id, description, operation, **fields)``."""
    for router_field in ROUTER_FIELDS:
        for kind, value in (("object", _HANDOFF), ("null", None), ("string", "x")):
            add(
                f"client_fields/{router_field.name}/{kind}",
                f"a client's {router_field.name} is {router_field.on_client.value}d",
                "client_fields",
                body=_with(router_field.path, value),
            )
    both = {**_with(("request_id",), "r"), "kv_transfer_params": _HANDOFF}
    others: dict[str, Any] = {
        "none": _with(("cache_salt",), "tenant-a"),
        "extension_args_of_the_clients": _with(("vllm_xargs", "my_processor"), 2),
        "extension_args_not_an_object": {"vllm_xargs": ["kv_transfer_params"]},
        "refused_before_dropped": both,
        "not_an_object": ["kv_transfer_params"],
    }
    for name, body in others.items():
        add(f"client_fields/{name}", "what else a client sends is its own", "client_fields",
            body=body)  # fmt: skip
    for count, limit in ((0, 128), (128, 128), (129, 128), (2, 1)):
        add(
            f"media_items/{count}_of_{limit}",
            "a request's media items within the cap, or a typed 400",
            "media_items",
            count=count,
            limit=limit,
        )
    for count, limit in ((16384, 16384), (16385, 16384)):
        add(
            f"media_items/parts/{count}_of_{limit}",
            "a request's messages and parts within the cap, or a typed 400",
            "media_items",
            count=count,
            limit=limit,
            of="parts",
        )
