"""A Python router's whole P/D hop, on messages and on bytes, next to one copy of the payload.

The hop is what a router does between receiving a serialized ``GenerateRequest``
and handing both legs to gRPC: read what the policy needs, build the decode leg
for a language-model-only worker, put the NIXL handoff on it, build the
sanitised prefill leg, and serialize both. The request is the bench's own:
8 images, 4096 ids, a 64-digit hash per image, at 0, 16 and 64 MiB of pixels.

- *message*: parse (and check) the ingress bytes, then ``pd_policy_grpc``'s
  message legs, each serialized;
- *bytes*: ``pd_policy_grpc.raw``: read the bytes, cut the legs from them,
  join each leg's buffers;
- *memcpy*: one copy of the ingress bytes, the least a hop that forwards the
  pixels in a new buffer can do.

Ratios are taken per round, the two cases timed back to back, and their median
reported; every figure comes from this one run.

Run alone: ``python bench/byte_hop.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from typing import Any, Final

from measuring import median_seconds, paired_ratio, verdicts
from wire_requests import MIB, wire_request

import pd_policy_grpc
from pd_policy import (
    KvConnectorMode,
    PrefillKv,
    VisionSupport,
    WorkerCapability,
    plan_kv_handoff,
)
from pd_policy_grpc import raw
from pd_policy_grpc.wire import pb

SIZES: Final = (0, 16, 64)
LM_ONLY: Final = WorkerCapability(VisionSupport.FALSE)
HANDOFF: Final = plan_kv_handoff(PrefillKv(KvConnectorMode.NIXL), n=1)

TARGETS: Final = {
    "bytes_over_memcpy": ("byte hop at 64 MiB ÷ one memcpy of the request", "<=", 1.2),
    "reads_flat_in_pixels": ("byte reads at 64 MiB ÷ at 0 MiB", "<=", 1.2),
    "message_over_bytes": ("message hop ÷ byte hop, at 64 MiB", ">=", 3.0),
}


def request_bytes(pixel_bytes: int) -> bytes:
    """The bench's request, serialized as a router receives it from a client (no KV yet)."""
    return wire_request(pixel_bytes, kv=False).SerializeToString()


def message_hop(data: bytes) -> tuple[bytes, bytes]:
    request = pd_policy_grpc.parse_generate_request(data)
    _, decode = pd_policy_grpc.build_decode_leg(request, LM_ONLY, check=False)
    pd_policy_grpc.apply_kv_handoff(decode, HANDOFF)
    prefill = pd_policy_grpc.prefill_leg(request, HANDOFF)
    return prefill.SerializeToString(), decode.SerializeToString()


def byte_hop(data: bytes) -> tuple[bytes, bytes]:
    request = raw.read_request(data)
    _, decode = raw.build_decode_leg(request, LM_ONLY)
    decode = raw.apply_kv_handoff(decode, HANDOFF)
    return bytes(raw.prefill_leg(request, HANDOFF)), bytes(decode)


def byte_reads(data: bytes) -> object:
    request = raw.read_request(data)
    return request.facts(), request.view()


def memcpy(data: bytes) -> bytes:
    return memoryview(data).tobytes()


def measure(quick: bool) -> dict[str, Any]:
    """Run the cases; the medians in seconds, the ratios and whether each target is met."""
    repeat = 3 if quick else 7
    data = {mib: request_bytes(mib * MIB) for mib in SIZES}
    # The legs are what the message hop builds: the byte hop must send the same messages.
    for mib in SIZES:
        got, want = byte_hop(data[mib]), message_hop(data[mib])
        assert [pb.GenerateRequest.FromString(leg) for leg in got] == [
            pb.GenerateRequest.FromString(leg) for leg in want
        ], "the byte hop's legs differ from the message hop's"
    cases: dict[str, float] = {}
    for mib in SIZES:
        for name, fn in (("message", message_hop), ("bytes", byte_hop), ("reads", byte_reads),
                         ("memcpy", memcpy)):  # fmt: skip
            cases[f"{name}/{mib}MiB"] = median_seconds(partial(fn, data[mib]), repeat=repeat)
            print(f"  byte-hop {name}/{mib}MiB {cases[f'{name}/{mib}MiB'] * 1e3:10.3f} ms",
                  file=sys.stderr)  # fmt: skip
    big, empty = data[64], data[0]
    rounds = repeat * 3
    ratios = {
        "bytes_over_memcpy": paired_ratio(
            partial(byte_hop, big), partial(memcpy, big), rounds=rounds
        ),
        "reads_flat_in_pixels": paired_ratio(
            partial(byte_reads, big), partial(byte_reads, empty), rounds=rounds
        ),
        "message_over_bytes": paired_ratio(
            partial(message_hop, big), partial(byte_hop, big), rounds=rounds
        ),
    }
    return {
        "request_bytes": {f"{mib}MiB": len(data[mib]) for mib in SIZES},
        "cases_median_seconds": cases,
        "ratios": ratios,
        "targets_met": verdicts(ratios, TARGETS),
    }


def table(results: dict[str, Any]) -> str:
    """The results as the Markdown of the docs' generated block."""
    cases = results["cases_median_seconds"]
    lines = [
        "| pixels | message hop | byte hop | byte reads | one memcpy |",
        "|---:|---:|---:|---:|---:|",
    ]
    for mib in SIZES:
        row = [f"{cases[f'{name}/{mib}MiB'] * 1e3:.3f} ms"
               for name in ("message", "bytes", "reads", "memcpy")]  # fmt: skip
        lines.append(f"| {mib} MiB | " + " | ".join(row) + " |")
    lines += ["", "| target | measured | goal | met |", "|---|---:|---:|:---:|"]
    for key, (label, op, target) in TARGETS.items():
        value = results["ratios"][key]
        met = "yes" if results["targets_met"][key] else "**no**"
        lines.append(f"| {label} | {value:.2f} | {op} {target} | {met} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    results = measure(parser.parse_args().quick)
    print(table(results))
    print(json.dumps(results["ratios"], indent=2))
    return 0 if all(results["targets_met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
