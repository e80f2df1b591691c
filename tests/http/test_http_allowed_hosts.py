"""``--admin-allowed-hosts`` as a pure decision: names compared as DNS compares them,
address literals against networks, and every entry that is no host refused at start.
(The attacks through the proxy, with a stand-in that must never be called, are in
``test_http_admin.py``.)"""

from __future__ import annotations

import pytest

from pd_policy import InvalidConfiguration
from pd_policy_vllm.http.fleet.allowed_hosts import AllowedHosts, allowed_hosts


def test_allowed_hosts_compare_as_dns_and_ip_compare() -> None:
    hosts = allowed_hosts(["Workers.Internal.", "10.1.0.0/16,fd00::/8", "[2001:db8::1]"])
    assert isinstance(hosts, AllowedHosts)
    for url in (
        "http://workers.internal:8000", "https://WORKERS.INTERNAL./", "http://10.1.2.3:8000",
        "http://u:p@10.1.255.255/", "http://[fd00::1]:8000", "http://[FD12:3456::9]/",
        "http://[2001:db8::1]:80", "http://[fe80::1%25eth0]:8000".replace("fe80", "fd00"),
    ):  # fmt: skip
        assert hosts.allows(url), url
    for url in (
        "http://workers.internal.evil", "http://evil.workers.internal", "http://10.2.0.1",
        "http://[fe80::1]", "http://[2001:db8::2]", "http://[::ffff:10.1.0.1]", "",
        "http://[fd00::1", "http://10.1.0.1:99999", "unix:///workers.internal",
        "http://workers%2einternal/", "http://%77orkers.internal/",
    ):  # fmt: skip
        assert not hosts.allows(url), url


@pytest.mark.parametrize("entry", ["", " , ", "1.2.3", "10.0.0.0/33", "0x7f", "a_b", "-a.b",
                                   "fd00::/129", "a..b", "http://a"])  # fmt: skip
def test_an_allowed_hosts_entry_that_is_no_host_is_a_configuration_error(entry: str) -> None:
    with pytest.raises(InvalidConfiguration) as caught:
        allowed_hosts([entry])
    assert caught.value.param == "admin_allowed_hosts"
