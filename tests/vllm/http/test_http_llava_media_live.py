"""Media identity through the proxy, against the LLaVA fleet's real ``vllm serve`` workers.

The fleet (``llava_http``, started once on 127.0.0.1 for the LLaVA modules, stopped by
process id): a full-vision prefill that also answers the baseline (with
``--trust-request-mm-kwargs`` and ``--enable-mm-embeds``), a ``--language-model-only``
decode, and the E/P/D pair. A media host on 127.0.0.1 serves one URL whose image the
tests change between requests, as a camera's ``latest.jpg`` does.

Each case is one that a shortcut identity answers wrongly with a 200: new content at one
URL, one image under two processing options, two images under one ``uuid``, one
``uuid`` from two tenants, and embeddings. Every answer must be the baseline's, token for token.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from epd_peers import EpdFleet, answer, epd_fleet
from http_fleets import HttpFleet
from http_peers import InProcessProxy, MediaHost, data_url, read_fleet
from llava_prompts import TEXT
from router_side import image

from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.media.fetch import PINNED_MEDIA_TYPE, RemoteMedia
from pd_policy_vllm.http.media.guard import MediaLimits
from pd_policy_vllm.http.proxy import Proxy

# The media host is on 127.0.0.1, which the proxy refuses by default.
LAB = MediaLimits(allow_private_hosts=True)

Answer = tuple[list[int], list[float]]


@pytest.fixture(scope="module")
def host() -> Iterator[MediaHost]:
    with MediaHost() as media:
        yield media


@pytest.fixture(scope="module")
def workers(llava_http: HttpFleet) -> tuple[HttpWorker, HttpWorker]:
    prefill, (decode,) = read_fleet("--prefill", llava_http.prefill, "--decode", llava_http.decode)
    return prefill, decode


def _proxy(workers: tuple[HttpWorker, HttpWorker], mode: RemoteMedia) -> Iterator[InProcessProxy]:
    prefill, decode = workers
    with InProcessProxy(
        Proxy(prefill, [decode], mrope=False, remote_media=mode, media_limits=LAB)
    ) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def fetching(workers: tuple[HttpWorker, HttpWorker]) -> Iterator[InProcessProxy]:
    yield from _proxy(workers, RemoteMedia.FETCH)


@pytest.fixture(scope="module")
def uncached(workers: tuple[HttpWorker, HttpWorker]) -> Iterator[InProcessProxy]:
    yield from _proxy(workers, RemoteMedia.UNCACHED)


@pytest.fixture(scope="module")
def epd(llava_http: HttpFleet) -> Iterator[EpdFleet]:
    with epd_fleet(llava_http, mrope=False) as fleet:
        yield fleet


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    image(seed).save(buffer, format="PNG")
    return buffer.getvalue()


def url_part(url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}, **extra}


def body(part: dict[str, Any], variant: str, **extra: Any) -> dict[str, Any]:
    content = [part, {"type": "text", "text": f"{variant} {TEXT}"}]
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 6,
            "temperature": 0, "logprobs": True, "return_token_ids": True, **extra}  # fmt: skip


def same(got: Answer, want: Answer) -> bool:
    return got[0] == want[0] and got[1] == pytest.approx(want[1], abs=1e-4)


def baseline(fleet: HttpFleet, seed: int, variant: str, **extra: Any) -> Answer:
    return answer(fleet.baseline, body(url_part(data_url(image(seed))), variant, **extra))


def decode_legs(proxy: InProcessProxy, fleet: HttpFleet) -> list[Any]:
    return [s.body for s in proxy.sent_to(fleet.decode)]


def test_the_proxy_learns_the_workers_media_rules_and_fetches(workers: Any) -> None:
    prefill, _ = workers
    assert prefill.media.rules.known and not prefill.media.rules.allowed_domains
    assert prefill.media.rules.allowed_local_path is None  # vLLM's default: no local files


@pytest.mark.parametrize("mode", ["fetching", "uncached"])
def test_new_content_at_one_url_gets_the_new_contents_answer(
    mode: str, request: pytest.FixtureRequest, host: MediaHost, llava_http: HttpFleet
) -> None:
    proxy: InProcessProxy = request.getfixturevalue(mode)
    expected = {seed: baseline(llava_http, seed, "camera") for seed in (1, 2)}
    assert expected[1][0] != expected[2][0]  # else matching them would prove nothing
    name = f"latest-{mode}.png"
    before = len(proxy.sent)
    for seed in (1, 2, 1):
        url = host.serve(name, png(seed), "image/png")
        assert same(answer(proxy.url, body(url_part(url), "camera")), expected[seed])
    prefills = [s.body for s in proxy.sent[before:] if s.url.startswith(llava_http.prefill)]
    sent = [leg["messages"][0]["content"][0]["image_url"]["url"] for leg in prefills]
    salts = [leg["cache_salt"] for leg in decode_legs(proxy, llava_http)[-3:]]
    assert host.fetches[name] == 3  # once a request: by the proxy, or by the prefill
    if mode == "fetching":
        # The bytes fetched once went to the prefill; the same bytes are the same item.
        assert all(u.startswith(f"data:{PINNED_MEDIA_TYPE};base64,") for u in sent)
        assert salts[0] == salts[2] != salts[1]
    else:
        assert all(u.endswith(name) for u in sent)
        assert len(set(salts)) == 3  # nothing shared across requests


def test_new_content_at_one_url_through_e_p_d(host: MediaHost, epd: EpdFleet) -> None:
    # The encoder renders the request, so it fetches the URL once and names the item by
    # what it fetched; no leg after it carries the URL.
    want = {seed: answer(epd.baseline, body(url_part(data_url(image(seed))), "epd-cam"))
            for seed in (1, 2)}  # fmt: skip
    for seed in (2, 1, 2):
        url = host.serve("latest-epd.png", png(seed), "image/png")
        assert same(answer(epd.proxy.url, body(url_part(url), "epd-cam")), want[seed])


def test_one_image_under_two_processing_options_is_two_items(
    fetching: InProcessProxy, llava_http: HttpFleet
) -> None:
    options = {"mm_processor_kwargs": {"do_normalize": False}}
    plain, changed = baseline(llava_http, 1, "opts"), baseline(llava_http, 1, "opts", **options)
    assert not same(plain, changed)  # the option changes what the engine computes
    part = url_part(data_url(image(1)))
    for extra, want in (({}, plain), (options, changed), ({}, plain)):
        assert same(answer(fetching.url, body(part, "opts", **extra)), want)
    legs = decode_legs(fetching, llava_http)[-3:]
    assert legs[0]["cache_salt"] == legs[2]["cache_salt"] != legs[1]["cache_salt"]
    # The decode worker does not trust per-request options, and needs none: no media.
    assert all("mm_processor_kwargs" not in leg for leg in legs)


def test_a_uuid_names_the_item_as_vllm_takes_it(
    fetching: InProcessProxy, llava_http: HttpFleet
) -> None:
    # vLLM takes a part's uuid as the item's hash: a second image under the first's uuid
    # is answered as the first, by the baseline itself. Through the proxy a uuid is its
    # tenant's name: the baseline's "llava-a" names nothing there, and within the tenant
    # the name holds as vLLM takes it (the client's promise), a uuid alone included.
    a, b = data_url(image(1)), data_url(image(2))
    first = answer(llava_http.baseline, body(url_part(a, uuid="llava-a"), "uuid"))
    reused = answer(llava_http.baseline, body(url_part(b, uuid="llava-a"), "uuid"))
    assert same(reused, first)
    other = answer(llava_http.baseline, body(url_part(b, uuid="llava-b"), "uuid"))
    assert not same(other, first)
    assert same(answer(fetching.url, body(url_part(b, uuid="llava-a"), "uuid")), other)
    assert same(answer(fetching.url, body(url_part(a, uuid="llava-a"), "uuid")), other)
    named = {"type": "image_url", "image_url": None, "uuid": "llava-a"}
    assert same(answer(fetching.url, body(named, "uuid")), other)


def test_a_tenant_sending_anothers_uuid_is_answered_as_its_own_image(
    fetching: InProcessProxy, llava_http: HttpFleet
) -> None:
    # Tenant x sends image A under uuid U; tenant y (its own cache_salt) sends image B
    # under U. Plain vLLM answers y as A (the hole); the proxy answers y as B, exactly as
    # vLLM answers B sent without a uuid, and x's uuid still names A for x.
    a, b = data_url(image(1)), data_url(image(2))
    want_a, want_b = (answer(llava_http.baseline, body(url_part(u), "tenant")) for u in (a, b))
    assert not same(want_a, want_b)  # else telling them apart would prove nothing
    plain = [answer(llava_http.baseline, body(url_part(u, uuid="plain-u"), "tenant",
                                              cache_salt=salt))
             for u, salt in ((a, "x"), (b, "y"))]  # fmt: skip
    assert same(plain[1], want_a)  # what vLLM does: y gets x's image's answer
    x = answer(fetching.url, body(url_part(a, uuid="tenant-u"), "tenant", cache_salt="x"))
    y = answer(fetching.url, body(url_part(b, uuid="tenant-u"), "tenant", cache_salt="y"))
    assert same(x, want_a)
    assert same(y, want_b) and not same(y, x)
    named = {"type": "image_url", "image_url": None, "uuid": "tenant-u"}
    assert same(answer(fetching.url, body(named, "tenant", cache_salt="x")), want_a)
    # No leg carried the client's uuid: every worker saw only the tenant's name for it.
    assert not any("tenant-u" in json.dumps(s.body) for s in fetching.sent)


def embeds(seed: int) -> str:
    import torch

    generator = torch.Generator().manual_seed(seed)
    buffer = io.BytesIO()
    # One image's embedding: its 36 placeholder positions, the text stack's hidden size.
    torch.save(torch.randn(36, 128, generator=generator), buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def test_embeddings_are_identified_by_their_bytes(
    fetching: InProcessProxy, llava_http: HttpFleet
) -> None:
    parts = {seed: {"type": "image_embeds", "image_embeds": embeds(seed)} for seed in (1, 2)}
    want = {seed: answer(llava_http.baseline, body(part, "embeds")) for seed, part in parts.items()}
    assert not same(want[1], want[2])
    for seed in (1, 2, 1):
        assert same(answer(fetching.url, body(parts[seed], "embeds")), want[seed])
    legs = decode_legs(fetching, llava_http)[-3:]
    assert legs[0]["cache_salt"] == legs[2]["cache_salt"] != legs[1]["cache_salt"]
    assert all("image_embeds" not in str(leg["messages"]) for leg in legs)
