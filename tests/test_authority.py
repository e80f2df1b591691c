"""A bare IPv6 worker address is kept whole wherever a URL or a bootstrap host is built:
brackets in a URL, never split at a colon, its zone id as ``%25`` in a URL and ``%`` for
a socket; text that could be read two ways is refused."""

from __future__ import annotations

import pytest

from pd_policy import InvalidConfiguration, KvConnectorMode, PrefillKv
from pd_policy.authority import authority, host_of_url, split_host_port, url_host, worker_url


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("fe80::1", "[fe80::1]"),
        ("::1", "[::1]"),
        ("[::1]", "[::1]"),
        ("fe80::1%eth0", "[fe80::1%25eth0]"),
        ("fe80::1%25eth0", "[fe80::1%25eth0]"),
        ("[fe80::1%eth0]", "[fe80::1%25eth0]"),
        ("::ffff:10.0.0.1", "[::ffff:10.0.0.1]"),
        ("10.0.0.1", "10.0.0.1"),
        ("prefill-0.svc", "prefill-0.svc"),
    ],
)
def test_a_host_is_written_as_a_url_writes_it(host: str, expected: str) -> None:
    assert url_host(host) == expected
    assert authority(host, 8000) == f"{expected}:8000"


@pytest.mark.parametrize(
    "host", ["", "[10.0.0.1]", "[]", "a/b", "u@h", "h:1", "fe80::1%", "fe80::1%e/0", "fe80::g"]
)
def test_a_host_no_authority_carries_is_refused(host: str) -> None:
    with pytest.raises(InvalidConfiguration) as caught:
        url_host(host)
    assert host not in caught.value.message or not host


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fe80::1", ("fe80::1", None)),  # not fe80: and port 1
        ("[fe80::1]:8000", ("fe80::1", 8000)),  # not split at the first colon
        ("[fe80::1]", ("fe80::1", None)),
        ("[fe80::1%25eth0]:8000", ("fe80::1%eth0", 8000)),
        ("fe80::1%eth0", ("fe80::1%eth0", None)),
        ("10.0.0.1:8000", ("10.0.0.1", 8000)),
        ("prefill-0", ("prefill-0", None)),
    ],
)
def test_host_and_port_are_split_with_an_ipv6_address_whole(
    text: str, expected: tuple[str, int | None]
) -> None:
    assert split_host_port(text) == expected


@pytest.mark.parametrize("text", ["[fe80::1", "[fe80::1]8000", "h:0", "h:x", "h:65536", "h:"])
def test_text_no_authority_reads_is_refused(text: str) -> None:
    with pytest.raises(InvalidConfiguration):
        split_host_port(text)


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("fe80::1", "http://[fe80::1]"),
        ("[fe80::1]:8000", "http://[fe80::1]:8000"),
        ("fe80::1%eth0", "http://[fe80::1%25eth0]"),
        ("::1", "http://[::1]"),
        ("10.0.0.5:8000", "http://10.0.0.5:8000"),
        ("http://[fe80::1]:8000/", "http://[fe80::1]:8000"),
        ("https://[fe80::1%eth0]:8443/base/", "https://[fe80::1%25eth0]:8443/base"),
        ("http://u:p@[::1]:8000", "http://u:p@[::1]:8000"),
        ("HTTP://h:1", "http://h:1"),
    ],
)
def test_a_worker_address_becomes_the_url_the_proxy_calls(address: str, url: str) -> None:
    assert worker_url(address) == url
    assert worker_url(url) == url  # normalised once is normalised


@pytest.mark.parametrize("address", ["http://fe80::1:8000", "ftp://h:1", "http://[::1]x", ""])
def test_an_address_read_two_ways_is_refused(address: str) -> None:
    with pytest.raises(InvalidConfiguration):
        worker_url(address)


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://[fe80::1%25eth0]:8000/v1", "fe80::1%eth0"),
        ("http://u:p@[::1]:8000", "::1"),
        ("https://h.svc", "h.svc"),
    ],
)
def test_the_host_of_a_url_is_bare(url: str, host: str) -> None:
    assert host_of_url(url) == host


@pytest.mark.parametrize(
    ("host", "addr"),
    [
        ("fe80::1", "http://[fe80::1]:9000"),
        ("[fe80::1]", "http://[fe80::1]:9000"),
        ("fe80::1%eth0", "http://[fe80::1%25eth0]:9000"),
        ("10.0.0.1", "http://10.0.0.1:9000"),
    ],
)
def test_the_mooncake_bootstrap_address_keeps_the_host_whole(host: str, addr: str) -> None:
    kv = PrefillKv(KvConnectorMode.MOONCAKE, "e", host, 9000)
    assert kv.bootstrap_addr == addr
