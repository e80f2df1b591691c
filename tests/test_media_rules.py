"""The worker's media rules, as a router applies them before fetching for it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd_policy import (
    DEFAULT_FETCH_TIMEOUTS,
    MalformedRequest,
    MediaFetchRules,
    MediaRefused,
    MediaSource,
    Modality,
    check_media_url,
    media_source,
)

RULES = MediaFetchRules(
    allowed_domains=["media.example", "CDN.example"], allowed_local_path="/srv/media"
)


@pytest.mark.parametrize(
    ("url", "source"),
    [
        ("data:image/png;base64,AAAA", MediaSource.INLINE),
        ("DATA:image/png;base64,AAAA", MediaSource.INLINE),
        ("https://media.example/a.png", MediaSource.REMOTE),
        ("HTTP://media.example/a.png", MediaSource.REMOTE),
        ("https://cdn.example:8443/a.png?sig=x", MediaSource.REMOTE),  # the port does not count
        ("file:///srv/media/a.png", MediaSource.LOCAL),
        ("file:///srv/media/sub/../a.png", MediaSource.LOCAL),
    ],
)
def test_urls_the_worker_reads(url: str, source: MediaSource) -> None:
    assert check_media_url(url, RULES, param="p") is source


@pytest.mark.parametrize(
    "url",
    [
        "",
        "ftp://media.example/a.png",
        "s3://bucket/a.png",
        "httpx://media.example/a.png",
        "a.png",
        "https:///a.png",  # no host
        "https://evil.example/a.png",  # not an allowed domain
        "https://sub.media.example/a.png",  # no subdomains: vLLM compares the host whole
        "https://media.example.evil/a.png",
        "https://[::1/a.png",  # a malformed IPv6 literal
        "file:///etc/passwd",
        "file:///srv/media",  # the directory itself: the worker wants a file strictly inside
        "file:///srv/media/../secret.png",  # a traversal out of the allowed path
        "file:///srv/mediaX/a.png",  # a sibling whose name starts the same
        "file://relative/a.png",
    ],
)
def test_urls_the_worker_would_refuse_are_refused_without_echoing_them(url: str) -> None:
    with pytest.raises(MediaRefused) as caught:
        check_media_url(url, RULES, param="messages[0].content[1]")
    error = caught.value
    assert error.status == 400 and not error.retryable
    assert error.param == "messages[0].content[1]"
    assert not url or url not in error.message


def test_a_worker_that_reads_no_local_files_refuses_them_all() -> None:
    with pytest.raises(MediaRefused, match="no --allowed-local-media-path"):
        check_media_url("file:///srv/media/a.png", MediaFetchRules(), param="p")
    # No allowed domains means any host, as in vLLM.
    assert check_media_url("https://anything.example/x", MediaFetchRules(), param="p") is (
        MediaSource.REMOTE
    )


@given(st.text(max_size=40))
def test_any_text_is_a_source_or_a_typed_refusal(text: str) -> None:
    for candidate in (text, "https://" + text, "file:///srv/media/" + text, "data:" + text):
        try:
            source = check_media_url(candidate, RULES, param="p")
        except MediaRefused as exc:
            assert exc.param == "p"
            assert len(candidate) < 8 or candidate not in exc.message
        else:
            assert source is media_source(candidate, param="p")


def test_limits_default_to_vllms_and_audio_takes_its_own_cap() -> None:
    rules = MediaFetchRules(max_download_bytes=100, max_audio_bytes=10)
    assert rules.max_bytes(Modality.IMAGE) == 100 and rules.max_bytes(Modality.AUDIO) == 10
    assert MediaFetchRules().max_bytes(Modality.VIDEO) == 256 * 2**20
    merged = MediaFetchRules(timeouts={Modality.VIDEO: 2}).timeouts
    assert merged == {**DEFAULT_FETCH_TIMEOUTS, Modality.VIDEO: 2.0}
    assert not MediaFetchRules().known


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"allowed_domains": "media.example"}, "allowed_domains"),  # a string, not a list
        ({"allowed_domains": [""]}, "allowed_domains"),
        ({"allowed_local_path": "relative"}, "allowed_local_path"),
        ({"max_download_bytes": 0}, "max_download_bytes"),
        ({"max_audio_bytes": True}, "max_audio_bytes"),
        ({"timeouts": {"image": 5}}, "timeouts"),
        ({"timeouts": {Modality.IMAGE: -1}}, "timeouts"),
        ({"allow_redirects": 1}, "allow_redirects"),
    ],
)
def test_ill_typed_rules_are_typed_errors(kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(MalformedRequest) as caught:
        MediaFetchRules(**kwargs)  # type: ignore[arg-type]
    assert caught.value.param == param
