"""A gRPC prefill worker's address names its Mooncake bootstrap host whole, however it is
written: ``[v6]:port``, gRPC's ``ipv6:[v6]:port``, ``dns:///host:port``, a bare IPv6
address (no port to split off), or an address with a zone id."""

from __future__ import annotations

import pytest

from pd_policy import InvalidConfiguration
from pd_policy_grpc import prefill_kv_from_info
from pd_policy_grpc.wire import pb

INFO = pb.GetServerInfoResponse(kv_connector="MooncakeConnector", kv_engine_id="e")


@pytest.mark.parametrize(
    ("address", "host", "addr"),
    [
        ("[fe80::1]:50051", "fe80::1", "http://[fe80::1]:8998"),
        ("ipv6:[::1]:50051", "::1", "http://[::1]:8998"),
        ("fe80::1", "fe80::1", "http://[fe80::1]:8998"),  # not "fe80:" and port 1
        ("[fe80::1%25eth0]:50051", "fe80::1%eth0", "http://[fe80::1%25eth0]:8998"),
        ("dns:///prefill-0.svc:50051", "prefill-0.svc", "http://prefill-0.svc:8998"),
        ("10.0.0.1:50051", "10.0.0.1", "http://10.0.0.1:8998"),
    ],
)
def test_the_bootstrap_host_is_the_whole_address(address: str, host: str, addr: str) -> None:
    kv = prefill_kv_from_info(INFO, address)
    assert (kv.bootstrap_host, kv.bootstrap_addr) == (host, addr)


@pytest.mark.parametrize("address", ["[fe80::1", "[fe80::1]x", "h:99999"])
def test_an_address_that_reads_two_ways_is_refused(address: str) -> None:
    with pytest.raises(InvalidConfiguration):
        prefill_kv_from_info(INFO, address)
