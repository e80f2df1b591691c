"""The decision, leg and handoff conformance vectors, run against a vendored copy of the seed's
policy: ``python -S vendored_runner.py VENDOR SITE PACKAGE VECTORS``.

It runs in an interpreter that sees only the copy (at ``VENDOR``, named ``PACKAGE``) and
``attrs`` (at ``SITE``): no site-packages, no ``src/``. It runs every ``plan`` case (the
decision, the leg and the handoff check), every ``kv_handoff`` case and every
``fold_salt`` case of ``VECTORS`` as the reference implementation's tools do, compares
each outcome with the committed one, and exits 1 on any difference or on a module loaded
from elsewhere than the standard library, ``attrs`` and the copy. It prints one line:
how many cases of each operation matched.
"""

from __future__ import annotations

import importlib
import json
import sys
import sysconfig
from collections import Counter
from typing import Any


def main(vendor: str, site: str, package: str, vectors: str) -> int:
    sys.path[:0] = [vendor, site]
    policy = importlib.import_module(package)
    codec = importlib.import_module(f"{package}.codec")
    connectors = importlib.import_module(f"{package}.connectors")
    prefill = importlib.import_module(f"{package}.prefill")
    request_mod = importlib.import_module(f"{package}.request")
    batch = importlib.import_module(f"{package}.batch")

    def error(exc: Any) -> dict[str, Any]:
        return {"status": exc.status, "error_code": exc.code, "error_param": exc.param}

    def plan(case: dict[str, Any]) -> dict[str, Any]:
        try:
            request = codec.request_from_json(case["request"])
            worker = codec.worker_from_json(case["decode_worker"])
        except policy.PolicyError as exc:
            return error(exc)
        try:
            form, leg = policy.build_decode_leg(request, worker)
            if "prefill" in case:
                spec = case["prefill"]
                returned = spec.get("kv_transfer_params")
                text = None if returned is None else json.dumps(returned, separators=(",", ":"))
                legacy = spec.get("kv_transfer_params_legacy")
                pair = None
                if legacy is not None:
                    pair = request_mod.LegacyKvParams(legacy["remote_host"], legacy["remote_port"])
                leg = policy.relay_kv(leg, text, pair)
                mode = policy.KvConnectorMode(spec.get("mode") or "nixl")
                policy.ensure_kv_handoff(request, form, leg, mode)
        except policy.PolicyError as exc:
            return error(exc)
        return {
            "status": 200,
            "form": form.value,
            "decode_leg": codec.request_to_json(leg),
            "cache_salt": policy.decode_cache_salt(leg),
            "upstream_cache_salt": policy.upstream_decode_cache_salt(leg),
        }

    def handoff(case: dict[str, Any]) -> dict[str, Any]:
        spec = dict(case["prefill_kv"])
        try:
            kv = connectors.PrefillKv(connectors.KvConnectorMode(spec.pop("mode")), **spec)
            planned = connectors.plan_kv_handoff(
                kv, n=case["n"], transfer_id=case.get("transfer_id")
            )
        except policy.InvalidConfiguration as exc:
            return error(exc)
        legacy = planned.decode_legacy
        outcome: dict[str, Any] = {
            "status": 200,
            "runs_prefill": planned.runs_prefill,
            "prefill_params": None
            if planned.prefill_params is None
            else json.loads(planned.prefill_params),
            "decode_params": None
            if planned.decode_params is None
            else json.loads(planned.decode_params),
            "decode_legacy": None if legacy is None else [legacy.remote_host, legacy.remote_port],
            "relays": planned.relays,
            "dp_rank": planned.dp_rank,
        }
        if "request" in case and planned.runs_prefill:
            request = codec.request_from_json(case["request"])
            outcome["prefill_leg"] = codec.request_to_json(prefill.prefill_leg(request, planned))
        return outcome

    def salt(case: dict[str, Any]) -> dict[str, Any]:
        identities = [(batch.Modality(m), h) for m, h in case["identities"]]
        return {
            "status": 200,
            "cache_salt": policy.fold_salt(identities, case.get("caller_salt")),
            "upstream_cache_salt": policy.upstream_cache_salt(h for _, h in identities),
        }

    operations = {"plan": plan, "kv_handoff": handoff, "fold_salt": salt}
    with open(vectors, encoding="utf-8") as file:
        cases = json.load(file)["cases"]
    matched: Counter[str] = Counter()
    wrong = []
    for case in cases:
        run = operations.get(case["operation"])
        if run is None:
            continue
        if run(case) == case["expected"]:
            matched[case["operation"]] += 1
        else:
            wrong.append(case["id"])
    paths = sysconfig.get_paths()
    allowed = (vendor, site, paths["stdlib"], paths["platstdlib"])
    foreign = sorted(
        name
        for name, module in sys.modules.items()
        if name != "__main__"
        and isinstance(getattr(module, "__file__", None), str)
        and not str(module.__file__).startswith(allowed)
    )
    print(json.dumps({"matched": dict(sorted(matched.items())), "wrong": wrong,
                      "foreign": foreign, "modules": sorted(
                          n for n in sys.modules if n.split(".")[0] == package)}))  # fmt: skip
    return 1 if wrong or foreign else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
