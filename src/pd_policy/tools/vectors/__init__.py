"""Conformance vectors: the policy's decisions as data, for other implementations.

Gateways in Rust, Go or C++ vendor this policy by re-implementing it. The
vectors let them prove they match: each case is an input in the JSON codec
and the outcome this implementation gives. The set is deterministic (the same
release writes the same bytes) and versioned; ``docs/conformance.md``
documents the format.

Operations:

* ``plan``: decide, build the decode leg, relay what the prefill returned (when
  the case says), run the handoff check; the outcome is the form, the leg and
  the decode worker's salt in both formats, or the error;
* ``select_decode_workers``: the indices of the candidates that can serve;
* ``ensure_model_accepts_media``: pass, or the error;
* ``worker_guard``: ``ensure_language_model_only_leg`` on a leg (``uses_mrope``
  and ``takes_mm_metadata`` optional);
* ``fold_salt``: the salt for identities and a caller's salt, in both formats;
* ``connector_mode``: a vLLM connector name's handoff contract, or the error;
* ``kv_handoff``: the handoff plan for a prefill worker and ``n`` (a fixed
  ``transfer_id``), and the prefill leg of a request under it;
* ``epd_prefill``: E/P/D's prefill leg for an encoder-cache consumer, from a request and
  the encoder's ``ec_transfer_params`` (the form, the leg and the parameters), or the error;
* ``kv_config_mode``, ``decode_kv``, ``leg_routes``: the KV wires
  ([`wire_operations`][pd_policy.tools.vectors.wire_operations]).
"""

from .cases import ADVERSARIAL
from .document import (
    FORMAT,
    VECTORS_VERSION,
    Mismatch,
    build_vectors,
    compare_results,
    dumps,
    run_vectors,
)
from .operations import run_case

__all__ = [
    "ADVERSARIAL",
    "FORMAT",
    "VECTORS_VERSION",
    "Mismatch",
    "build_vectors",
    "compare_results",
    "dumps",
    "run_case",
    "run_vectors",
]
