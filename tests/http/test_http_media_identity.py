"""Each chat part's identity, by the core's rule: what makes two items one, over HTTP."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from pd_policy import (
    DecodeForm,
    IdentityBasis,
    MalformedRequest,
    MediaFetchRules,
    MediaRefused,
    MediaSource,
    Modality,
    Support,
    WorkerCapability,
    build_decode_leg,
    fold_cache_salt,
    item_identity,
    relay_kv,
)
from pd_policy_vllm.http import PrefillReply, Route, decode_body, media_parts, policy_request
from pd_policy_vllm.openai.media.identity import WorkerMedia, uncached_parts

LM_ONLY, VISION = WorkerCapability(Support.FALSE), WorkerCapability(Support.TRUE)


def data_url(payload: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(payload).decode()


def image(url: str | None, **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": None if url is None else {"url": url}, **extra}


def body(*parts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    content = [*parts, {"type": "text", "text": "what is it?"}]
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


def identities(b: dict[str, Any], media: WorkerMedia | None = None, nonce: str = "n") -> Any:
    request = policy_request(b, Route.CHAT, request_id="r", mrope=False, media=media, nonce=nonce)
    return [h for batch in request.batches for h in batch.mm_hashes]


A, B = data_url(b"image A"), data_url(b"image B")


def test_inline_bytes_are_their_identity() -> None:
    assert identities(body(image(A))) == identities(body(image(A)))
    assert identities(body(image(A))) != identities(body(image(B)))
    # The same bytes as audio are another item.
    audio = {"type": "audio_url", "audio_url": {"url": A}}
    assert identities(body(audio)) != identities(body(image(A)))


def test_every_processing_option_is_part_of_the_identity() -> None:
    plain = identities(body(image(A)))
    assert identities(body(image(A), mm_processor_kwargs={"do_normalize": False})) != plain
    assert identities(body(image(A), media_io_kwargs={"image": {"image_mode": "L"}})) != plain
    # Another modality's media options do not touch an image.
    assert identities(body(image(A), media_io_kwargs={"video": {"num_frames": 4}})) == plain
    # The worker's own settings count as the request's do.
    worker = WorkerMedia(processor_kwargs={"do_normalize": False})
    assert identities(body(image(A)), worker) != plain
    video_only = WorkerMedia(media_io_kwargs={"video": {"num_frames": 4}})
    assert identities(body(image(A)), video_only) == plain
    assert identities(body(image(A)), WorkerMedia(media_io_kwargs={"image": {"x": 1}})) != plain
    # Key order is not an option.
    two = {"a": 1, "b": 2}
    assert identities(body(image(A), mm_processor_kwargs=two)) == identities(
        body(image(A), mm_processor_kwargs=dict(reversed(two.items())))
    )


def test_a_uuid_is_the_clients_name_for_the_item_as_vllm_takes_it() -> None:
    # Two images under one uuid are one item, as the prefill's vLLM keys them.
    assert identities(body(image(A, uuid="u1"))) == identities(body(image(B, uuid="u1")))
    assert identities(body(image(A, uuid="u1"))) != identities(body(image(A, uuid="u2")))
    assert identities(body(image(A, uuid="u1"))) != identities(body(image(A)))
    # A uuid alone names a cached item; vLLM reads it with str().
    assert identities(body(image(None, uuid=7))) == identities(body(image(A, uuid="7")))
    expected = item_identity(Modality.IMAGE, IdentityBasis.CLIENT, "u1")
    assert identities(body(image(A, uuid="u1"))) == [expected]
    with pytest.raises(MalformedRequest) as caught:
        identities(body(image(None)))
    assert caught.value.param == "messages[0].content[0]"


def test_a_url_is_a_name_and_gets_no_reusable_identity_until_fetched() -> None:
    url = "https://media.example/latest.jpg"
    first, again = (
        identities(body(image(url)), nonce="n1"),
        identities(body(image(url)), nonce="n2"),
    )
    assert first != again  # two requests for one URL share nothing
    assert identities(body(image(url)), nonce="n1") == first  # pure, given the nonce
    assert uncached_parts(body(image(url)), MediaFetchRules())
    assert not uncached_parts(body(image(url, uuid="u")), MediaFetchRules())
    assert not uncached_parts(body(image(A)), MediaFetchRules())
    # Two uncached items of one request are two items.
    assert len(set(identities(body(image(url), image(url))))) == 2


def test_parts_are_read_as_vllm_reads_them() -> None:
    parts = media_parts(body(
        {"type": "input_image", "image_url": A},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "image_embeds", "image_embeds": "AAAA"},
        {"type": "video_url", "video_url": {"url": "https://v.example/c.mp4"}},
        {"type": "image_url", "video_url": {"url": A}, "uuid": "u"},  # vLLM places by key
    ))  # fmt: skip
    assert [(p.modality, p.source, p.key) for p in parts] == [
        (Modality.IMAGE, MediaSource.INLINE, "image_url"),
        (Modality.AUDIO, MediaSource.INLINE, "input_audio"),
        (Modality.IMAGE, MediaSource.INLINE, "image_embeds"),
        (Modality.VIDEO, MediaSource.REMOTE, "video_url"),
        (Modality.VIDEO, MediaSource.INLINE, "video_url"),
    ]


def test_a_url_the_worker_would_refuse_is_refused_before_any_worker() -> None:
    rules = MediaFetchRules(allowed_domains=["media.example"])
    media = WorkerMedia(rules)
    with pytest.raises(MediaRefused) as caught:
        identities(body(image(A), image("https://evil.example/x.png")), media)
    assert caught.value.param == "messages[0].content[1]"
    with pytest.raises(MediaRefused):
        identities(body(image("file:///srv/a.png")))  # vLLM's default reads no local file
    with pytest.raises(MalformedRequest) as bad:
        identities(body(image(A), mm_processor_kwargs=[1]))
    assert bad.value.param == "mm_processor_kwargs"


def test_a_stripped_leg_carries_no_processing_options() -> None:
    b = body(image(A), mm_processor_kwargs={"do_normalize": False}, media_io_kwargs={})
    form, leg = build_decode_leg(
        policy_request(b, Route.CHAT, request_id="r", mrope=False), LM_ONLY
    )
    leg = relay_kv(leg, {"transfer_id": "t"})
    out = decode_body(b, Route.CHAT, form, leg, PrefillReply((1, 2, 3), {"transfer_id": "t"}, {}))
    assert "mm_processor_kwargs" not in out.body and "media_io_kwargs" not in out.body


def test_a_vision_decode_that_reads_an_uncached_url_again_gets_a_salt_of_its_own() -> None:
    url = body(image("https://media.example/latest.jpg"), cache_salt="tenant")
    request = policy_request(url, Route.CHAT, request_id="r", mrope=False, nonce="n")
    form, leg = build_decode_leg(request, VISION)
    assert form is DecodeForm.IDENTITY_ONLY
    leg = relay_kv(leg, {"transfer_id": "t"})
    reply = PrefillReply((1, 2), {"transfer_id": "t"}, {})
    out = decode_body(url, Route.CHAT, form, leg, reply, uncached=True)
    assert out.body["cache_salt"] == fold_cache_salt(leg) != "tenant"
    # Bytes the proxy holds need none: the worker hashes the same bytes the prefill did.
    inline = body(image(A), cache_salt="tenant")
    kept = decode_body(inline, Route.CHAT, form, leg, reply, uncached=False)
    assert kept.body["cache_salt"] == "tenant"
