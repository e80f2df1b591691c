"""Render once through ``pd-policy-proxy --kv-routing`` over stand-in prefills
(``tests/kv_stub.py``): a request its lookup rendered is prefilled on the scale-out
generate route from that render, whose tensors the lookup asked for, and its blocks are
named as before (the next request finds them where the lookup predicts). With
``--no-render-once``, under NIXL push (the legs must share a route), and from a render
without its tensors, the prefill gets the client's body as before."""

from __future__ import annotations

import attrs
import pytest
from test_http_kv_routing import CONFIG, PNG_X, Rig, chat, rig, run

from kv_stub import StubConfig
from kv_stub_wire import tensor

TENSORS = attrs.evolve(CONFIG, tensor_bytes=4096)
PUSH = attrs.evolve(TENSORS, connector="NixlPushConnector")


def legs(r: Rig) -> tuple[int, int]:
    """The prefill legs the stand-ins served: on the generate route, and on the client's."""
    generates = sum(p.generates for p in r.stubs.prefills)
    return generates, sum(len(p.records) for p in r.stubs.prefills) - generates


def asked_tensors(r: Rig) -> bool:
    """Whether the last render the lookup sent asked for the items' tensors."""
    (asked,) = [p.last_render for p in r.stubs.prefills if p.last_render is not None]
    return "mm_payload" not in asked


def test_a_request_the_lookup_rendered_is_prefilled_from_that_render() -> None:
    async def main() -> None:
        async with rig(2, TENSORS) as r:
            body = chat("describe it", image=PNG_X, salt="tenant-a")
            status, _ = await r.post(body)
            assert status == 200 and asked_tensors(r)
            assert legs(r) == (1, 0)  # the client's body reached no prefill
            (prefill,) = [p for p in r.stubs.prefills if p.generates]
            leg = prefill.last_generate
            assert leg is not None
            assert leg["features"]["kwargs_data"] == {"image": [tensor(PNG_X, 4096)]}
            assert leg["cache_salt"] == "tenant-a" and leg["stream"] is False
            assert leg["sampling_params"]["max_tokens"] == 1
            assert leg["kv_transfer_params"] == {"do_remote_decode": True,
                                                 "do_remote_prefill": False}  # fmt: skip
            # Its blocks are named as the client's body would have named them: the same
            # request again is predicted on that prefill, and served from its cache.
            await r.settled()
            tokens, _ = r.last(prefill)
            assert (await r.post(body))[0] == 200
            assert legs(r) == (2, 0) and prefill.generates == 2
            assert r.last(prefill) == (tokens, (tokens - 1) // 16 * 16)
            assert await r.metric("pd_policy_kv_routing_total", outcome="hit") == 1

    run(main)


def test_a_completions_prompt_is_looked_up_and_prefilled_from_its_render() -> None:
    # Its render answers a list: of one prompt here.
    async def main() -> None:
        async with rig(2, TENSORS) as r:
            body = {"model": "tiny", "prompt": "once upon a time " * 8, "max_tokens": 2}
            async with r.session.post(r.url + "/v1/completions", json=body) as answer:
                assert answer.status == 200
            assert sum(p.renders for p in r.stubs.prefills) == 1 and legs(r) == (1, 0)
            assert await r.metric("pd_policy_kv_routing_total", outcome="miss") == 1
            (prefill,) = [p for p in r.stubs.prefills if p.generates]
            assert prefill.last_generate is not None
            assert len(prefill.last_generate["token_ids"]) == 1 + 4 * 8  # BOS, the words

    run(main)


@pytest.mark.parametrize(
    ("config", "flags", "tensors", "text_once"),
    [
        (CONFIG, (), True, True),  # the render carries no tensors: images cannot be taken
        (TENSORS, ("--no-render-once",), False, False),
        (PUSH, (), False, False),  # push pairs the legs by route: both stay on chat
    ],
    ids=["render-without-tensors", "no-render-once", "nixl-push"],
)
def test_otherwise_the_prefill_gets_the_clients_body(
    config: StubConfig, flags: tuple[str, ...], tensors: bool, text_once: bool
) -> None:
    async def main() -> None:
        async with rig(2, config, *flags) as r:
            assert (await r.post(chat("describe it", image=PNG_X)))[0] == 200
            assert asked_tensors(r) is tensors
            assert legs(r) == (0, 1)
            # A text request's render has no item to carry: taken wherever a plan may.
            assert (await r.post(chat("describe it", "in words")))[0] == 200
            assert legs(r) == ((1, 1) if text_once else (0, 2))

    run(main)
