"""Conformance vectors for HTTP proxies: OpenAI bodies in, P/D legs (or the refusal) out.

A sibling of the core's vectors (``pd_policy.tools.vectors``), for proxies in front of
``vllm serve`` that reimplement [`pd_policy_vllm.openai`][pd_policy_vllm.openai]. Each case
gives the client's body and route, the decode workers (in preference order), the prefill
worker's handoff contract, whether the model uses M-RoPE, and the prefill's response when
a prefill runs; the outcome is the prefill leg's body and the decode leg's route and body,
or the refusal's status, code and field. The format is documented in ``docs/http.md``.

Run it: ``python -m pd_policy_vllm.openai.tools.vectors write FILE`` writes the set,
``... run FILE`` prints this implementation's results for one.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

from pd_policy import DecodeCandidate, KvConnectorMode, PolicyError, PrefillKv, worker_from_json
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.plan.steps import decode_leg, plan_rendered, plan_request
from pd_policy_vllm.openai.tools.vector_cases import http_cases
from pd_policy_vllm.openai.wire import codec

__all__ = ["FORMAT", "NONCE", "VERSION", "build", "dumps", "run", "run_case"]

FORMAT: Final = "pd-policy-http-vectors"
VERSION: Final = 4
#: The value an uncached item's identity is made unique with, in every case: a proxy draws
#: one per request.
NONCE: Final = "vector-nonce"


def run_case(case: Mapping[str, Any]) -> dict[str, Any]:
    """This implementation's outcome for one case."""
    candidates = [DecodeCandidate(worker_from_json(w), i) for i, w in enumerate(case["workers"])]
    spec = dict(case["prefill_kv"])
    outcome: dict[str, Any] = {"status": 200}
    try:
        kv = PrefillKv(KvConnectorMode(spec.pop("mode")), **spec)
        plan = plan_request(
            case["body"],
            Route(case["route"]),
            candidates,
            kv,
            mrope=case["mrope"],
            request_id="vector",
            transfer_id="xfer-0001",
            renders=case.get("renders", False),
            nonce=NONCE,
        )
        if plan.render is not None:
            outcome["render_leg"] = plan.render
            plan = plan_rendered(plan, case["render_response"])
        leg = decode_leg(plan, case.get("prefill_response") if plan.prefill is not None else None)
    except PolicyError as exc:
        return {"status": exc.status, "error_code": exc.code, "error_param": exc.param}
    # As the worker reads it: the forwarded ids are a JSON array on the wire.
    decode: dict[str, Any] = {"route": leg.route, "body": codec.loads(codec.dumps(leg.body))}
    if leg.derender is not None:
        decode["derender"] = {"route": leg.derender.route, **leg.derender.template}
    return {
        **outcome,
        "form": plan.form.value,
        "decode_worker": plan.decode.handle,
        "prefill_leg": plan.prefill,
        "prefill_route": plan.prefill_route,
        "decode_leg": decode,
    }


def build() -> dict[str, Any]:
    """The whole document: every case with its expected outcome."""
    cases = http_cases()
    for case in cases:
        case["expected"] = run_case(case)
    return {"format": FORMAT, "version": VERSION, "cases": cases}


def dumps(document: Mapping[str, Any]) -> str:
    """The canonical text of a document: the same data, the same bytes."""
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def run(document: Mapping[str, Any]) -> dict[str, Any]:
    """This implementation's results for a vectors document."""
    results = [{"id": c["id"], "outcome": run_case(c)} for c in document["cases"]]
    return {"format": f"{FORMAT}-results", "version": VERSION, "results": results}


def main(argv: Sequence[str] | None = None) -> int:
    """``write FILE``: the set; ``run FILE``: this implementation's results, to stdout."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] not in {"write", "run"}:
        print(
            "usage: python -m pd_policy_vllm.openai.tools.vectors write|run FILE", file=sys.stderr
        )
        return 2
    command, path = args
    if command == "write":
        with open(path, "w", encoding="utf-8") as out:
            out.write(dumps(build()))
        return 0
    with open(path, encoding="utf-8") as source:
        print(dumps(run(json.load(source))), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
