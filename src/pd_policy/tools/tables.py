"""The docs tables, rendered from the code so the docs cannot drift from it.

``docs/decisions.md``, ``docs/epd.md``, ``docs/errors.md``, ``docs/grpc.md``,
``docs/architecture.md``, ``docs/security.md`` and ``docs/wires.md`` hold these tables between
``<!-- BEGIN GENERATED: name -->`` and ``<!-- END GENERATED: name -->``
markers; a test checks that they are current and ``pd-policy tables --write``
rewrites them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Final

from pd_policy.catalog import ERROR_CATALOG
from pd_policy.connectors import NIXL_PREFILL_PARAMS, KvConnectorMode
from pd_policy.decision import DecodeForm, sequential_pd_decode_form
from pd_policy.decode_kv import DecodeKv, KvLoad, LoadFailure
from pd_policy.encoder_cache import encoder_outputs
from pd_policy.epd import PrefillForm, encoder_consumer_leg, needs_encode_leg
from pd_policy.errors import PolicyError
from pd_policy.exchange.states import TRANSITIONS, Phase
from pd_policy.handoff_fields import REQUIRED_KV_FIELDS
from pd_policy.mrope import has_mrope_grids
from pd_policy.request import Request
from pd_policy.router_fields import ROUTER_FIELDS
from pd_policy.tensor import PayloadLocation
from pd_policy.wires import CONNECTOR_MODES, CONNECTORS, MULTI_CONNECTOR
from pd_policy.worker import Support, WorkerCapability

from .scenarios import image_request, media_ref_request, mrope_request, text_request

__all__ = [
    "TABLES",
    "decision_table",
    "epd_table",
    "error_table",
    "exchange_table",
    "router_fields_table",
    "splice",
    "wires_table",
]

_WORKERS: Final = (
    ("vision-capable (`true`)", WorkerCapability(Support.TRUE)),
    ("unknown (no label)", WorkerCapability(Support.UNKNOWN)),
    ("language-model-only (`false`)", WorkerCapability(Support.FALSE)),
    (
        "language-model-only, takes metadata",
        WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE),
    ),
    (
        "language-model-only, takes metadata, blind to a stripped leg",
        WorkerCapability(
            Support.FALSE,
            accepts_mm_metadata=Support.TRUE,
            decode_kv=DecodeKv(KvLoad.BY_REQUEST, LoadFailure.RECOMPUTE),
        ),
    ),
)

_REQUESTS: Final[tuple[tuple[str, Request], ...]] = (
    ("text, n=1", text_request()),
    ("text, n>1", text_request(n=2)),
    ("grid-less image, n=1", image_request()),
    ("grid-less image, n>1", image_request(n=2)),
    ("M-RoPE grids, n=1", mrope_request()),
    ("M-RoPE grids, n>1", mrope_request(n=2)),
    ("M-RoPE grid in shared memory, n=1", mrope_request(grid_location=PayloadLocation.SHM)),
    ("M-RoPE image without hashes, n=1", mrope_request(hashes=False)),
    ("media references, n=1", media_ref_request()),
    ("media references, n>1", media_ref_request(n=2)),
)


def _cell(request: Request, worker: WorkerCapability) -> str:
    try:
        form = sequential_pd_decode_form(request, worker)
    except PolicyError as exc:
        return f"{exc.status} `{exc.code}`"
    return f"`{form.name}`" + (" + KV" if request.relays_kv else "")


def decision_table() -> str:
    """The decision table: request shape by decode worker, each cell computed by the code."""
    head = "| request | " + " | ".join(name for name, _ in _WORKERS) + " |"
    rule = "|---" * (len(_WORKERS) + 1) + "|"
    rows = [
        f"| {label} | " + " | ".join(_cell(req, w) for _, w in _WORKERS) + " |"
        for label, req in _REQUESTS
    ]
    legend = ", ".join(f"`{f.name}`" for f in DecodeForm)
    return "\n".join(
        [
            head,
            rule,
            *rows,
            "",
            f'Forms: {legend}. "+ KV": the prefill\'s KV parameters are relayed. "Takes '
            'metadata": `supports_vision` false and `accepts_mm_metadata` true. "Blind to a '
            'stripped leg": its KV connector matches blocks by content hash or loads '
            'nothing, or its `kv_load_failure_policy` is `"recompute"` (see '
            "[the wires](wires.md)): text still goes to it.",
        ]
    )


def _epd_answer(request: Request, *, metadata: bool, drop_first: bool = False) -> str:
    items = [h for b in request.batches for h in b.mm_hashes][1 if drop_first else 0 :]
    meta = {"image_grid_thw": [[1, 2, 2]]} if metadata else {}
    return json.dumps({h: {"item_indices": [0], "metadata": meta} for h in items})


_EPD_REQUESTS: Final = (
    ("text", text_request(), False, False),
    ("grid-less image (LLaVA: no metadata published)", image_request(), False, False),
    ("M-RoPE image (Qwen2-VL: its grid published)", mrope_request(), True, False),
    ("an item the encoder did not answer for", mrope_request(), True, True),
    ("media references", media_ref_request(), False, False),
)


def _epd_cells(request: Request, worker: WorkerCapability, metadata: bool, drop: bool) -> str:
    if not needs_encode_leg(request):
        return f"no encode leg (P/D) | - | {_cell(request, worker)}"
    try:
        built = encoder_consumer_leg(
            request, encoder_outputs(_epd_answer(request, metadata=metadata, drop_first=drop))
        )
    except PolicyError as exc:
        return f"sent | {exc.status} `{exc.code}`, nothing sent | -"
    return f"sent | `{built.form.name}` + encoder outputs | {_cell(request, worker)}"


def epd_table() -> str:
    """E/P/D: what each leg carries by request, for a language-model-only decode."""
    rows = [
        "| request | encode leg | prefill leg (cache consumer) | decode leg |",
        "|---" * 4 + "|",
    ]
    for label, request, metadata, drop in _EPD_REQUESTS:
        worker = _WORKERS[3][1] if has_mrope_grids(request) else _WORKERS[2][1]
        rows.append(f"| {label} | {_epd_cells(request, worker, metadata, drop)} |")
    legend = ", ".join(f"`{f.name}`" for f in PrefillForm)
    return "\n".join(
        [
            *rows,
            "",
            f"Prefill forms: {legend}. The decode worker is "
            "language-model-only (and takes metadata, for M-RoPE).",
        ]
    )


def connector_table() -> str:
    """The KV connectors this library knows, by handoff contract, with what each leg carries."""
    by_mode: dict[KvConnectorMode, list[str]] = {mode: [] for mode in KvConnectorMode}
    for name, mode in CONNECTOR_MODES.items():
        by_mode[mode].append(f"`{name}`" if name else "none (no `kv_transfer_config`)")
    what = {
        KvConnectorMode.NIXL: (
            "tagged `" + NIXL_PREFILL_PARAMS + "`",
            "the parameters the prefill returned, relayed",
        ),
        KvConnectorMode.NIXL_PUSH: (
            "tagged `" + NIXL_PREFILL_PARAMS + "`, on the decode leg's route",
            "the parameters the prefill returned, relayed, under the prefill's request id",
        ),
        KvConnectorMode.MOONCAKE: (
            "tagged with a minted `transfer_id`",
            "the same transfer, the engine id and the bootstrap address; or, with no engine "
            "id to mint for, the legacy typed host and port",
        ),
        KvConnectorMode.TRANSFER: (
            "tagged `" + NIXL_PREFILL_PARAMS + "`",
            "the parameters the prefill returned, relayed",
        ),
        KvConnectorMode.PASSTHROUGH: ("not tagged", "whatever the engine returned, relayed"),
    }
    lines = [
        "| contract | connectors | prefill leg | decode leg | a handoff names |",
        "|---|---|---|---|---|",
    ]
    for mode in KvConnectorMode:
        prefill, decode = what[mode]
        fields = ", ".join(f"`{f}`" for f in REQUIRED_KV_FIELDS[mode]) or "any field"
        if mode is KvConnectorMode.MOONCAKE:
            fields += "; or the legacy host and port"
        lines.append(
            f"| `{mode.value}` | {', '.join(by_mode[mode])} | {prefill} | {decode} | {fields} |"
        )
    lines += [
        "",
        "Every other connector is refused at start-up (`pd_invalid_configuration`), with "
        "its reason ([the wires](wires.md)). A "
        "stripped multimodal leg whose handoff lacks a named field (`do_remote_prefill` must "
        'be `true`; `null`, `""`, `[]` and `{}` count as missing) is refused after prefill '
        "(`pd_decode_missing_kv_transfer_params`, 502); a text leg recomputes.",
    ]
    return "\n".join(lines)


def wires_table() -> str:
    """Every connector vLLM registers (and this library's own), served or refused."""
    loads = {
        KvLoad.BY_REQUEST: "the named transfer",
        KvLoad.BY_CONTENT: "by content hash: no stripped media leg",
        KvLoad.NONE: "nothing: no stripped media leg",
        KvLoad.UNKNOWN: "as its connectors do",
    }
    lines = ["| connector | served as | a decode running it loads |", "|---|---|---|"]
    for name, wire in CONNECTORS.items():
        served = f"`{wire.mode.value}`" if wire.mode is not None else f"refused: {wire.why}"
        if name == MULTI_CONNECTOR:
            served = "its connectors' one handoff, read from its config; by its name alone: refused"
        label = f"`{name}`" if name else "none"
        lines.append(f"| {label} | {served} | {loads[wire.loads]} |")
    return "\n".join(lines)


def error_table() -> str:
    """The error catalog as a table."""
    lines = ["| code | HTTP | retryable | meaning |", "|---|---|---|---|"]
    for entry in ERROR_CATALOG.values():
        status = "from gRPC status" if entry.status is None else str(entry.status)
        retry = "default rules" if entry.retryable else "no"
        lines.append(f"| `{entry.code}` | {status} | {retry} | {entry.meaning} |")
    return "\n".join(lines)


def exchange_table() -> str:
    """The exchange's phases and the events each takes, from its transition table: the
    phases in the order a request meets them, then each edge."""
    final = (Phase.DONE, Phase.FAILED)
    path = " ─▶ ".join(p.value for p in Phase if p not in final) + f" ─▶ {Phase.DONE.value}"
    retried = sorted(
        {
            kind.__name__
            for p, events in TRANSITIONS.items()
            for kind, to in events.items()
            if Phase.PLANNING in to and p is not Phase.NEW
        }
    )
    lines = [
        "```",
        path,
        f"  a retry ({', '.join(retried)}) ─▶ {Phase.PLANNING.value}; any phase ─▶ "
        f"{Phase.FAILED.value}",
        "```",
        "",
        "| phase | event | leads to |",
        "|---|---|---|",
    ]
    for phase, events in TRANSITIONS.items():
        if not events:
            lines.append(f"| `{phase.value}` | (final) | |")
        for kind, to in events.items():
            ordered = ", ".join(f"`{p.value}`" for p in Phase if p in to)
            lines.append(f"| `{phase.value}` | `{kind.__name__}` | {ordered} |")
    return "\n".join(lines)


def router_fields_table() -> str:
    """The fields only a router may set, and what becomes of a client's."""
    lines = ["| field | from a client | why the router owns it |", "|---|---|---|"]
    for field in ROUTER_FIELDS:
        done = (
            "refused: 400 `pd_router_owned_field`"
            if field.on_client.value == "refuse"
            else ("dropped (logged once at INFO)")
        )
        lines.append(f"| `{field.name}` | {done} | {field.why} |")
    return "\n".join(lines)


#: Every generated table, by the name its markers use.
TABLES: Final[dict[str, Callable[[], str]]] = {
    "connectors": connector_table,
    "decisions": decision_table,
    "epd": epd_table,
    "errors": error_table,
    "exchange": exchange_table,
    "router-fields": router_fields_table,
    "wires": wires_table,
}


def splice(document: str, name: str, table: str) -> str:
    """Replace the generated block called ``name`` in ``document`` with ``table``.

    Raises ``ValueError`` if the markers are missing.
    """
    begin, end = f"<!-- BEGIN GENERATED: {name} -->", f"<!-- END GENERATED: {name} -->"
    head, sep, rest = document.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not (sep and sep2):
        raise ValueError(f"no generated block {name!r} in the document")
    return f"{head}{begin}\n{table}\n{end}{tail}"
