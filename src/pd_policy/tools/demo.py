"""The ``pd-policy demo`` table: every scenario through the policy, in 100 columns, with a
legend for its short forms."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from pd_policy.request import Request
from pd_policy.worker import WorkerCapability

from .outcome import Outcome, plan
from .scenarios import SCENARIOS, Scenario

__all__ = ["LEGEND", "demo_rows", "demo_table", "outcome_to_json", "summarize_leg"]

_REFUSAL_PREFIX: Final = "pd_decode_language_model_only_"

#: What the table's short forms mean; printed under it.
LEGEND: Final = (
    "worker   vision: full vision; LM-only: --language-model-only; LM+meta: LM-only, and\n"
    "         takes the M-RoPE metadata (grid, hash, placeholder) of an image it has KV for\n"
    "refused  the code is pd_decode_language_model_only_<name>; missing_kv is\n"
    "         pd_decode_missing_kv_transfer_params (a 502: never an image-blind answer)\n"
    "leg      ids: expanded input ids; grid: M-RoPE grid; pl: placeholder ranges;\n"
    "         hash: content hashes; KV: the relayed kv_transfer_params\n"
    "salt     mm1:...: the decode cache_salt, identities folded; none: no salt\n"
    "no KV    the prefill returned no kv_transfer_params"
)


def summarize_leg(leg: Request) -> str:
    """A short summary of a decode leg that shows no URL, salt or KV secret."""
    parts = [f"{len(leg.input_ids)} ids" if leg.input_ids is not None else "text"]
    for b in leg.batches:
        if b.pixel_values is not None:
            parts.append("pixels")
        if b.tensors:
            parts.append("grid" if b.tensor_names == ("image_grid_thw",) else "tensors")
        if b.placeholders:
            parts.append(f"{len(b.placeholders)} pl")
        parts.append(f"{len(b.mm_hashes)} hash")
    if leg.media_refs:
        parts.append(f"{len(leg.media_refs)} refs")
    if leg.n > 1:
        parts.append(f"n={leg.n}")
    if leg.has_kv_transfer_params:
        parts.append("KV")
    return ", ".join(parts)


def outcome_to_json(outcome: Outcome) -> dict[str, Any]:
    """The outcome as JSON: the form, leg and salts, or the status and error body."""
    if outcome.error is not None:
        return {"status": outcome.status, "error": outcome.error.to_body()["error"]}
    return outcome.served_json()


def _request_label(sc: Scenario) -> str:
    request = sc.request
    if request.media_refs:
        what = "media refs"
    elif any(b.tensors for b in request.batches):
        what = "M-RoPE image"
    elif request.batches:
        what = "image"
    else:
        what = "text"
    if request.n > 1:
        what += f", n={request.n}"
    if sc.prefill.kv_transfer_params is None and sc.prefill.kv_legacy is None:
        what += ", no KV"
    return what


def _worker_label(worker: WorkerCapability) -> str:
    if not worker.language_model_only:
        return "vision"
    return "LM+meta" if worker.takes_mm_metadata else "LM-only"


def _salt(salt: str | None) -> str:
    if salt is None:
        return "none"
    return salt[:11] + "..." if len(salt) > 14 else salt


def demo_rows(scenarios: Sequence[Scenario] = SCENARIOS) -> list[list[str]]:
    """The table's rows, the header first."""
    rows = [["#", "request", "worker", "HTTP", "form, or refused", "decode leg", "salt"]]
    for i, sc in enumerate(scenarios, 1):
        outcome = plan(sc.request, sc.decode_worker, sc.prefill)
        if outcome.error is not None:
            code = outcome.error.code
            short = code.removeprefix(_REFUSAL_PREFIX)
            if code == "pd_decode_missing_kv_transfer_params":
                short = "missing_kv"
            what, leg, salt = f"refused: {short}", "-", "-"
        else:
            assert outcome.form is not None and outcome.leg is not None
            what, leg, salt = (
                outcome.form.name,
                summarize_leg(outcome.leg),
                _salt(outcome.cache_salt),
            )
        worker = _worker_label(sc.decode_worker)
        rows.append([str(i), _request_label(sc), worker, str(outcome.status), what, leg, salt])
    return rows


def demo_table(scenarios: Sequence[Scenario] = SCENARIOS) -> str:
    """The table, aligned, then its legend."""
    rows = demo_rows(scenarios)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n\n" + LEGEND
