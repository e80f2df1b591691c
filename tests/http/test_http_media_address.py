"""Which addresses the proxy refuses to fetch media from, judged without I/O: every special
block, in each of the spellings that reach it, and only those."""

from __future__ import annotations

import ipaddress

import pytest

from pd_policy_vllm.http.flags import media_limits, parser
from pd_policy_vllm.http.media.address import host_address, refused_address
from pd_policy_vllm.http.media.guard import MediaLimits

REFUSED = [
    "127.0.0.1", "127.255.255.254", "0.0.0.0", "0.1.2.3", "10.1.2.3", "172.16.0.1",
    "172.31.255.255", "192.168.1.1", "100.64.0.1", "100.127.255.255", "169.254.169.254",
    "169.254.0.1", "192.0.0.170", "192.0.2.1", "198.18.0.1", "198.51.100.1", "203.0.113.1",
    "224.0.0.1", "239.255.255.250", "240.0.0.1", "255.255.255.255",
    "::", "::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:10.0.0.1",
    "::127.0.0.1", "fd00:ec2::254", "fc00::1", "fe80::1", "fe80::1%eth0", "fec0::1",
    "ff02::1", "ff0e::1", "2001:db8::1", "2001::1", "100::1", "64:ff9b::7f00:1",
    "64:ff9b::a9fe:a9fe", "64:ff9b:1::1", "2002:7f00:1::1", "2002:a00:1::",
]  # fmt: skip
PUBLIC = [
    "1.1.1.1", "8.8.8.8", "93.184.216.34", "100.63.255.255", "100.128.0.0", "172.15.255.255",
    "172.32.0.0", "169.253.255.255", "192.167.255.255", "223.255.255.255",
    "2606:4700:4700::1111", "2001:4860:4860::8888", "::ffff:8.8.8.8", "64:ff9b::808:808",
    "2002:808:808::1",
]  # fmt: skip


@pytest.mark.parametrize("address", REFUSED)
def test_every_special_address_is_refused(address: str) -> None:
    assert refused_address(address)
    assert MediaLimits().refuses(address)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_not(address: str) -> None:
    assert not refused_address(address)
    assert not MediaLimits().refuses(address)


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("0x7f000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"), ("127.1", "127.0.0.1"), ("0", "0.0.0.0"),
        ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"), ("[::1]", "::1"), ("::1", "::1"),
        ("::ffff:127.0.0.1", "::ffff:127.0.0.1"), ("[fe80::1%25eth0]", "fe80::1"),
        ("fe80::1%eth0", "fe80::1"),
    ],
)  # fmt: skip
def test_a_literal_host_is_read_in_every_form_a_resolver_passes_through(
    host: str, address: str
) -> None:
    assert host_address(host) == ipaddress.ip_address(address)
    assert refused_address(address)


@pytest.mark.parametrize("host", ["example.com", "1password.com", "localhost", "0x", "a::b::c"])
def test_a_name_is_no_literal(host: str) -> None:
    assert host_address(host) is None


def test_a_lab_allows_every_address_or_only_its_networks() -> None:
    assert not MediaLimits(allow_private_hosts=True).refuses("127.0.0.1")
    lab = MediaLimits(allow_networks=["10.0.0.0/24", "fd00::/64"])
    assert not lab.refuses("10.0.0.5") and not lab.refuses("::ffff:10.0.0.5")
    assert not lab.refuses("fd00::5")
    assert lab.refuses("10.0.1.5") and lab.refuses("127.0.0.1") and lab.refuses("fd00:1::5")
    assert not lab.refuses("8.8.8.8")
    with pytest.raises(ValueError, match="host bits set"):
        MediaLimits(allow_networks=["10.0.0.1/8"])  # host bits set: a typo, not a network
    with pytest.raises(ValueError, match="max_bytes must be positive"):
        MediaLimits(max_bytes=0)
    with pytest.raises(ValueError, match="max_redirects must be"):
        MediaLimits(max_redirects=-1)


def test_the_flags_set_the_media_limits_and_refuse_one_that_is_not_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--prefill", "http://p", "--decode", "http://d"]
    assert media_limits(parser().parse_args(argv)) == MediaLimits()
    limits = media_limits(parser().parse_args([
        *argv, "--media-max-bytes", "1000", "--media-max-redirects", "0", "--media-timeout",
        "2.5", "--media-allow-network", "10.0.0.0/24", "--media-allow-network", "fd00::/64",
    ]))  # fmt: skip
    assert limits == MediaLimits(max_bytes=1000, max_redirects=0, timeout=2.5,
                                 allow_networks=["10.0.0.0/24", "fd00::/64"])  # fmt: skip
    assert media_limits(parser().parse_args([*argv, "--media-allow-private-hosts"])) == (
        MediaLimits(allow_private_hosts=True)
    )
    for bad in (["--media-max-bytes", "0"], ["--media-max-redirects", "-1"],
                ["--media-timeout", "0"], ["--media-allow-network", "10.0.0.1/8"]):  # fmt: skip
        with pytest.raises(SystemExit):
            parser().parse_args([*argv, *bad])
    assert "invalid" in capsys.readouterr().err
