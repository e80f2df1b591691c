"""``make bench``: what the policy costs next to the request it routes.

Timing is ``timeit`` with warm-up, repeats and medians; every ratio compares
cases measured in this one run, on this machine. Prints a table, writes
``bench/results.json`` and rewrites the tables in ``docs/performance.md``. The HTTP
proxy (``bench/http_proxy.py``), ``SequentialPd`` under load (``bench/grpc_load.py``) and a
router's whole hop on messages and on bytes (``bench/byte_hop.py``) are measured too, unless
skipped.

Run: ``python bench/run.py [--quick] [--no-docs] [--no-proxy] [--no-grpc-load] [--no-byte-hop]
[--no-media] [--no-balance] [--no-processes] [--no-gateways] [--no-soak]``. The media identity bench
(``bench/media_identity.py``), the fleet balance simulation (``bench/balance.py``), the
proxy at 1, 2 and 4 processes (``bench/proxy_processes.py``) and the routers beside SMG's
gateway (``bench/gateways.py``) and a soak of 10⁵ requests through the proxy
(``bench/soak.py``) run too.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import balance  # bench/, beside this script
import byte_hop  # bench/, beside this script
import gateways  # bench/, beside this script
import google.protobuf
import grpc_load  # bench/, beside this script
import http_proxy  # bench/, beside this script
import media_identity  # bench/, beside this script
import proxy_processes  # bench/, beside this script
import soak  # bench/, beside this script
from measuring import median_seconds, paired_ratio, verdicts
from wire_requests import KV, MIB, wire_mrope_request, wire_request

import grpc
import pd_policy
import pd_policy_grpc
from pd_policy import (
    Modality,
    MultimodalBatch,
    PayloadLocation,
    PlaceholderRange,
    Request,
    TensorDescriptor,
    VisionSupport,
    WorkerCapability,
    clone_without_mm,
    fold_salt,
    has_mrope_grids,
    sequential_pd_decode_form,
    unidentified_media,
)
from pd_policy.tools.tables import splice
from pd_policy_grpc.wire import pb

ROOT = Path(__file__).resolve().parent.parent
LM_ONLY = WorkerCapability(VisionSupport.FALSE)
TAKES_METADATA = WorkerCapability(VisionSupport.FALSE, accepts_mm_metadata=VisionSupport.TRUE)

TARGETS = {
    "flat_in_pixels": ("build_decode_leg at 64 MiB ÷ at 0 MiB", "<=", 1.2),
    "naive_over_leg": ("naive at 64 MiB ÷ build_decode_leg at 64 MiB", ">=", 50.0),
    "leg_over_floor": ("build_decode_leg ÷ floor (both serialized), at 64 MiB", "<=", 2.0),
    "decision_over_lookup": (
        "decision ÷ reading its facts and a dict lookup, two image batches, LM-only worker",
        "<=",
        1.5,
    ),
    "memory_64_over_0": ("memory added at 64 MiB ÷ at 0 MiB", "<=", 1.5),
    "metadata_flat_in_pixels": (
        "M-RoPE metadata leg at 64 MiB ÷ at 0 MiB (LM-only worker that takes metadata)",
        "<=",
        1.2,
    ),
}


# --- inputs ------------------------------------------------------------------------


def _decision_facts(request: Request, worker: WorkerCapability) -> tuple[bool, ...]:
    """What the decision reads, read the way it reads it."""
    return (
        worker.language_model_only, request.n <= 1, has_mrope_grids(request),
        bool(request.media_refs), request.has_mm_inputs, worker.takes_mm_metadata,
        unidentified_media(request) is None,
    )  # fmt: skip


def core_request(images: int, *, batches: int = 1) -> Request:
    per = 16
    ids = tuple(range(4, 4 + 8)) + (32000,) * (per * images) + (13, 14)
    out = []
    for b in range(batches):
        pixels = TensorDescriptor(
            "pixel_values", (images, 3, 336, 336), "float32", PayloadLocation.INLINE, 1
        )
        out.append(
            MultimodalBatch(
                modality=Modality.IMAGE,
                pixel_values=pixels,
                placeholders=[PlaceholderRange(8 + i * per, per) for i in range(images)]
                if b == 0
                else (),
                mm_hashes=tuple(f"{b}{i:063x}" for i in range(images)),
                im_token_id=32000,
            )
        )
    return Request("bench", input_ids=ids, batches=out, kv_transfer_params=KV, cache_salt="tenant")


def naive_leg(msg: pb.GenerateRequest) -> bytes:
    leg = pb.GenerateRequest()
    leg.CopyFrom(msg)
    leg.ClearField("mm_inputs")
    leg.ClearField("extra_mm_inputs")
    leg.ClearField("media_refs")
    for_hashes = pb.MultimodalInputs(
        mm_hashes=msg.mm_inputs.mm_hashes, modality=msg.mm_inputs.modality
    )
    leg.mm_inputs.CopyFrom(for_hashes)
    return leg.SerializeToString()


def floor_leg(msg: pb.GenerateRequest) -> bytes:
    """The least any decode leg must do: build and serialize the fields every leg carries
    (the ids, the hashes, the KV parameters and the sampling parameters), and no more."""
    leg = pb.GenerateRequest(
        request_id=msg.request_id, kv_transfer_params_json=msg.kv_transfer_params_json
    )
    leg.tokenized.input_ids.extend(msg.tokenized.input_ids)
    leg.mm_inputs.mm_hashes.extend(msg.mm_inputs.mm_hashes)
    leg.mm_inputs.modality = msg.mm_inputs.modality
    leg.sampling_params.CopyFrom(msg.sampling_params)
    return leg.SerializeToString()


def our_leg(msg: pb.GenerateRequest) -> bytes:
    return pd_policy_grpc.build_decode_leg(msg, LM_ONLY)[1].SerializeToString()


def our_leg_prechecked(msg: pb.GenerateRequest) -> bytes:
    # A router that ran check_generate_request on ingress (parse_generate_request does).
    return pd_policy_grpc.build_decode_leg(msg, LM_ONLY, check=False)[1].SerializeToString()


# --- memory ------------------------------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_added(msg: pb.GenerateRequest, legs: int = 16) -> dict[str, float]:
    """Bytes one decode leg adds: Python allocations (tracemalloc peak) and process RSS.

    upb allocates message storage outside Python's allocator, so RSS growth while
    holding ``legs`` legs is measured too, per leg.
    """
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    one = pd_policy_grpc.build_decode_leg(msg, LM_ONLY)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del one
    gc.collect()
    before = rss_bytes()
    held = [pd_policy_grpc.build_decode_leg(msg, LM_ONLY)[1] for _ in range(legs)]
    per_leg = max(rss_bytes() - before, 0) / legs
    del held
    return {"tracemalloc_peak_bytes": peak, "rss_per_leg_bytes": per_leg}


# --- run ---------------------------------------------------------------------------


def run(quick: bool) -> dict[str, Any]:
    repeat, min_time = (3, 0.05) if quick else (7, 0.2)
    cases: dict[str, float] = {}

    def bench(name: str, fn: Callable[[], object]) -> None:
        cases[name] = median_seconds(fn, repeat=repeat, min_time=min_time)
        print(f"  {name:48s} {cases[name] * 1e6:12.2f} µs", file=sys.stderr)

    two_batches, text = core_request(2, batches=2), Request("t", input_ids=tuple(range(64)))
    bench(
        "decision/two_image_batches/lm_only",
        lambda: sequential_pd_decode_form(two_batches, LM_ONLY),
    )
    bench("decision/text/lm_only", lambda: sequential_pd_decode_form(text, LM_ONLY))
    for images in (1, 8, 64):
        request = core_request(images)
        identities = [(Modality.IMAGE, h) for h in request.batches[0].mm_hashes]
        bench(f"core/clone_without_mm/{images}_images", partial(clone_without_mm, request))
        bench(f"core/fold_salt/{images}_images", partial(fold_salt, identities, "tenant"))
    for mib in (0, 1, 16, 64):
        msg = wire_request(mib * MIB)
        bench(
            f"grpc/build_decode_leg/{mib}MiB",
            partial(pd_policy_grpc.build_decode_leg, msg, LM_ONLY),
        )
        bench(f"grpc/build_decode_leg+serialize/{mib}MiB", partial(our_leg, msg))
        bench(
            f"grpc/build_decode_leg(check=False)+serialize/{mib}MiB",
            partial(our_leg_prechecked, msg),
        )
        bench(f"grpc/naive/{mib}MiB", partial(naive_leg, msg))
        bench(f"grpc/floor/{mib}MiB", partial(floor_leg, msg))
        metadata = wire_mrope_request(mib * MIB)
        bench(
            f"grpc/build_decode_leg(metadata)/{mib}MiB",
            partial(pd_policy_grpc.build_decode_leg, metadata, TAKES_METADATA),
        )
    memory = {f"{mib}MiB": memory_added(wire_request(mib * MIB)) for mib in (0, 64)}
    big = wire_request(64 * MIB)
    paired = {
        "leg_over_floor": paired_ratio(
            partial(our_leg, big), partial(floor_leg, big), rounds=repeat * 3
        ),
        "prechecked_leg_over_floor": paired_ratio(
            partial(our_leg_prechecked, big), partial(floor_leg, big), rounds=repeat * 3
        ),
    }
    # The decision against the least it could be: reading the same facts off the request
    # and the worker, and looking the answer up in a table of them.
    answers = {
        _decision_facts(two_batches, LM_ONLY): sequential_pd_decode_form(two_batches, LM_ONLY)
    }
    paired["decision_over_lookup"] = paired_ratio(
        lambda: sequential_pd_decode_form(two_batches, LM_ONLY),
        lambda: answers[_decision_facts(two_batches, LM_ONLY)],
        rounds=repeat * 3,
    )
    small_ids = wire_request(64 * MIB, one_byte_ids=True)
    paired["one_byte_ids_leg_over_floor"] = paired_ratio(
        partial(our_leg, small_ids), partial(floor_leg, small_ids), rounds=repeat * 3
    )

    def mem(key: str) -> float:
        return max(memory[key]["tracemalloc_peak_bytes"], 1.0)

    ratios = {
        "flat_in_pixels": cases["grpc/build_decode_leg/64MiB"]
        / cases["grpc/build_decode_leg/0MiB"],
        "naive_over_leg": cases["grpc/naive/64MiB"]
        / cases["grpc/build_decode_leg+serialize/64MiB"],
        "leg_over_floor": paired["leg_over_floor"],
        "decision_over_lookup": paired["decision_over_lookup"],
        "memory_64_over_0": mem("64MiB") / mem("0MiB"),
        "metadata_flat_in_pixels": cases["grpc/build_decode_leg(metadata)/64MiB"]
        / cases["grpc/build_decode_leg(metadata)/0MiB"],
    }
    informative = {
        "decision_us": cases["decision/two_image_batches/lm_only"] * 1e6,
        "prechecked_leg_over_floor": paired["prechecked_leg_over_floor"],
        "one_byte_ids_leg_over_floor": paired["one_byte_ids_leg_over_floor"],
        "check_share": 1 - paired["prechecked_leg_over_floor"] / paired["leg_over_floor"],
    }
    return {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "versions": {
            "pd_policy": pd_policy.__version__,
            "protobuf": google.protobuf.__version__,
            "grpcio": grpc.__version__,
        },
        "method": f"timeit, warm-up, {repeat} repeats of >= {min_time}s, median per call",
        "cases_median_seconds": cases,
        "memory": memory,
        "ratios": ratios,
        "informative_ratios": informative,
        "targets_met": verdicts(ratios, TARGETS),
    }


def table(results: dict[str, Any]) -> str:
    lines = ["| ratio | target | measured | met |", "|---|---|---|---|"]
    for key, (label, op, target) in TARGETS.items():
        value = results["ratios"][key]
        ok = "yes" if results["targets_met"][key] else "**no**"
        lines.append(f"| {label} | {op} {target:g} | {value:.3g} | {ok} |")
    info = results["informative_ratios"]
    lines += [
        "",
        f"Informative: build_decode_leg(check=False) ÷ floor = "
        f"{info['prechecked_leg_over_floor']:.3g} (a router that checked the message on "
        f"ingress); the wire check is {info['check_share']:.0%} of the default call. With "
        f"every id 7 (1-byte varints, the first bench's input), build_decode_leg ÷ floor = "
        f"{info['one_byte_ids_leg_over_floor']:.3g}. The decision's median: "
        f"{info['decision_us']:.2f} µs (an absolute time: it moves with the machine's load).",
    ]
    lines += ["", "| case | median |", "|---|---|"]
    for name, seconds in results["cases_median_seconds"].items():
        lines.append(f"| `{name}` | {seconds * 1e6:.2f} µs |")
    lines += [
        "",
        "| memory, one decode leg | Python peak (tracemalloc) | RSS per held leg |",
        "|---|---|---|",
    ]
    for key, value in results["memory"].items():
        lines.append(
            f"| {key} of pixels | {value['tracemalloc_peak_bytes'] / 1024:.1f} KiB"
            f" | {value['rss_per_leg_bytes'] / 1024:.1f} KiB |"
        )
    machine = results["machine"]
    lines += [
        "",
        f"Measured on {machine['platform']}, {machine['cpus']} CPUs, Python {machine['python']}, "
        f"protobuf {results['versions']['protobuf']}, grpcio {results['versions']['grpcio']}; "
        f"{results['method']}.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats")
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/performance.md")
    parser.add_argument("--no-proxy", action="store_true", help="skip the HTTP proxy benchmark")
    parser.add_argument(
        "--no-grpc-load", action="store_true", help="skip the SequentialPd load benchmark"
    )
    parser.add_argument(
        "--no-byte-hop", action="store_true", help="skip the message-versus-bytes hop benchmark"
    )
    parser.add_argument("--no-media", action="store_true", help="skip the media identity benchmark")
    parser.add_argument("--no-balance", action="store_true", help="skip the balance simulation")
    parser.add_argument(
        "--no-processes", action="store_true", help="skip the proxy at 1, 2 and 4 processes"
    )
    parser.add_argument(
        "--no-gateways", action="store_true", help="skip the routers beside SMG's gateway"
    )
    parser.add_argument("--no-soak", action="store_true", help="skip the proxy's long run")
    args = parser.parse_args()
    results = run(args.quick)
    if not args.no_proxy:
        results["http_proxy"] = http_proxy.measure(args.quick)
    if not args.no_grpc_load:
        results["grpc_load"] = grpc_load.measure(args.quick)
    if not args.no_byte_hop:
        results["byte_hop"] = byte_hop.measure(args.quick)
    if not args.no_media:
        results["media_identity"] = media_identity.measure(args.quick)
    if not args.no_balance:
        results["balance"] = balance.measure(args.quick)
    if not args.no_processes and not args.no_proxy:
        results["proxy_processes"] = proxy_processes.measure(args.quick)
    if not args.no_gateways:
        results["gateways"] = gateways.measure(args.quick)
    if not args.no_soak:
        results["soak"] = soak.measure(args.quick)
    (ROOT / "bench" / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    rendered = table(results)
    print(rendered)
    proxy = http_proxy.table(results["http_proxy"]) if "http_proxy" in results else None
    if proxy is not None:
        print("\n" + proxy)
    load = grpc_load.table(results["grpc_load"]) if "grpc_load" in results else None
    if load is not None:
        print("\n" + load)
    hop = byte_hop.table(results["byte_hop"]) if "byte_hop" in results else None
    if hop is not None:
        print("\n" + hop)
    media = media_identity.table(results["media_identity"]) if "media_identity" in results else None
    if media is not None:
        print("\n" + media)
    spread = balance.table(results["balance"]) if "balance" in results else None
    if spread is not None:
        print("\n" + spread)
    forks = results.get("proxy_processes")
    scaling = proxy_processes.table(forks) if forks is not None else None
    if scaling is not None:
        print("\n" + scaling)
    routers = gateways.table(results["gateways"]) if "gateways" in results else None
    if routers is not None:
        print("\n" + routers)
    flat = soak.table(results["soak"]) if "soak" in results else None
    if flat is not None:
        print("\n" + flat)
    if not args.no_docs:
        doc = ROOT / "docs" / "performance.md"
        text = splice(doc.read_text(encoding="utf-8"), "performance", rendered)
        if proxy is not None:
            text = splice(text, "performance-http", proxy)
        if load is not None:
            text = splice(text, "performance-grpc-load", load)
        if hop is not None:
            text = splice(text, "performance-byte-hop", hop)
        if media is not None:
            text = splice(text, media_identity.NAME, media)
        if spread is not None:
            text = splice(text, balance.NAME, spread)
        if scaling is not None:
            text = splice(text, proxy_processes.NAME, scaling)
        if routers is not None:
            text = splice(text, gateways.NAME, routers)
        if flat is not None:
            text = splice(text, soak.NAME, flat)
        doc.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
