"""``pd-policy``: explain a decision, list the errors, run the demo, render the docs tables.

The only module of the core that does I/O; nothing else imports it, so a
gateway that vendors the core can leave it out.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from pd_policy import __version__
from pd_policy.catalog import ERROR_CATALOG
from pd_policy.codec import request_from_json, worker_from_json
from pd_policy.errors import PolicyError
from pd_policy.request import Request
from pd_policy.worker import WorkerCapability

from .outcome import Outcome, PrefillResult, plan
from .scenarios import SCENARIOS
from .tables import TABLES, splice
from .vectors import build_vectors, compare_results, dumps, run_vectors

__all__ = ["main", "outcome_to_json", "summarize_leg"]

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


def summarize_leg(leg: Request) -> str:
    """A one-line summary of a decode leg that shows no URL, salt or KV secret."""
    parts = [f"{len(leg.input_ids)} ids" if leg.input_ids is not None else "text"]
    for b in leg.batches:
        what = []
        if b.pixel_values is not None:
            what.append("pixels")
        if b.tensors:
            what.append("tensors " + ",".join(b.tensor_names))
        if b.placeholders:
            what.append(f"{len(b.placeholders)} placeholders")
        what.append(f"{len(b.mm_hashes)} hashes")
        parts.append(f"{b.modality.value}[{'; '.join(what)}]")
    if leg.media_refs:
        parts.append(f"{len(leg.media_refs)} media refs")
    parts.append(f"n={leg.n}")
    parts.append("KV relayed" if leg.has_kv_transfer_params else "no KV")
    return ", ".join(parts)


def outcome_to_json(outcome: Outcome) -> dict[str, Any]:
    """The outcome as JSON: the form, leg and salts, or the status and error body."""
    if outcome.error is not None:
        return {"status": outcome.status, "error": outcome.error.to_body()["error"]}
    return outcome.served_json()


def _load_json(path: str) -> Any:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    return json.loads(text)


def _short(salt: str | None, caller: str | None) -> str:
    if salt is None:
        return "none"
    if salt == caller:
        return "the caller's salt, unchanged"
    return salt[:16] + "…" if len(salt) > 16 else salt


def _explain(args: argparse.Namespace, out: TextIO) -> int:
    try:
        raw_request, raw_worker = _load_json(args.request), _load_json(args.decode_worker)
        prefill = None
        if args.prefill_kv is not None:
            prefill = PrefillResult.returned(_load_json(args.prefill_kv))
        elif args.prefill_returned_nothing:
            prefill = PrefillResult.nothing()
    except (OSError, ValueError) as exc:
        print(f"pd-policy: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        request: Request = request_from_json(raw_request)
        worker: WorkerCapability = worker_from_json(raw_worker)
        outcome = plan(request, worker, prefill)
    except PolicyError as exc:
        outcome = Outcome(None, None, None, None, exc)
    if args.json:
        json.dump(outcome_to_json(outcome), out, indent=2)
        out.write("\n")
    elif outcome.error is not None:
        out.write(f"refused:     {outcome.status} {outcome.error.code}\n")
        json.dump(outcome.error.to_body(), out, indent=2)
        out.write("\n")
    else:
        assert outcome.form is not None and outcome.leg is not None
        out.write(f"form:        {outcome.form.name}\n")
        out.write(f"decode leg:  {summarize_leg(outcome.leg)}\n")
        out.write(f"cache_salt:  {_short(outcome.cache_salt, request.cache_salt)}\n")
        out.write(f"upstream:    {_short(outcome.upstream_cache_salt, None)}\n")
        if not outcome.handoff_checked:
            out.write(
                "handoff:     not checked (pass --prefill-kv or --prefill-returned-nothing)\n"
            )
    return EXIT_OK if outcome.ok else EXIT_REFUSED


def _errors(args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        rows = [
            {"code": e.code, "status": e.status, "retryable": e.retryable, "meaning": e.meaning}
            for e in ERROR_CATALOG.values()
        ]
        json.dump(rows, out, indent=2)
        out.write("\n")
    else:
        out.write(TABLES["errors"]() + "\n")
    return EXIT_OK


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _demo(args: argparse.Namespace, out: TextIO) -> int:
    rows = [["#", "scenario", "decode worker", "outcome", "HTTP", "decode leg", "cache_salt"]]
    results = []
    for i, sc in enumerate(SCENARIOS, 1):
        outcome = plan(sc.request, sc.decode_worker, sc.prefill)
        results.append({"scenario": sc.name, **outcome_to_json(outcome)})
        worker = "LM-only" if sc.decode_worker.language_model_only else "full vision"
        if outcome.error is not None:
            what, leg, salt = outcome.error.code, "-", "-"
        else:
            assert outcome.form is not None and outcome.leg is not None
            what, leg = outcome.form.name, summarize_leg(outcome.leg)
            salt = _short(outcome.cache_salt, sc.request.cache_salt)
        rows.append([str(i), sc.name, worker, what, str(outcome.status), leg, salt])
    if args.json:
        json.dump(results, out, indent=2)
        out.write("\n")
    else:
        out.write(f"pd-policy {__version__}: sequential P/D decode legs\n\n")
        out.write(_table(rows) + "\n")
    return EXIT_OK


def _tables(args: argparse.Namespace, out: TextIO) -> int:
    table = TABLES[args.name]()
    if args.write is None:
        out.write(table + "\n")
        return EXIT_OK
    path = Path(args.write)
    path.write_text(splice(path.read_text(encoding="utf-8"), args.name, table), encoding="utf-8")
    return EXIT_OK


def _vectors(args: argparse.Namespace, out: TextIO) -> int:
    text = dumps(build_vectors())
    if args.out == "-":
        out.write(text)
    else:
        Path(args.out).write_text(text, encoding="utf-8")
    return EXIT_OK


def _run_vectors(args: argparse.Namespace, out: TextIO) -> int:
    try:
        document = _load_json(args.vectors)
    except (OSError, ValueError) as exc:
        print(f"pd-policy: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out.write(dumps(run_vectors(document)))
    return EXIT_OK


def _check_vectors(args: argparse.Namespace, out: TextIO) -> int:
    try:
        vectors, results = _load_json(args.vectors), _load_json(args.results)
    except (OSError, ValueError) as exc:
        print(f"pd-policy: {exc}", file=sys.stderr)
        return EXIT_USAGE
    mismatches = compare_results(vectors, results)
    for mismatch in mismatches:
        out.write(f"MISMATCH {mismatch}\n")
    total = len(vectors["cases"])
    out.write(f"{total - len({m.case_id for m in mismatches})} of {total} cases match\n")
    return EXIT_REFUSED if mismatches else EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pd-policy", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    explain = sub.add_parser("explain", help="explain the decode leg for a request and worker")
    explain.add_argument("request", help="request JSON file ('-' for stdin)")
    explain.add_argument("--decode-worker", required=True, help="decode worker JSON file")
    handoff = explain.add_mutually_exclusive_group()
    handoff.add_argument("--prefill-kv", help="JSON file: the KV parameters prefill returned")
    handoff.add_argument(
        "--prefill-returned-nothing", action="store_true", help="prefill returned no KV parameters"
    )
    explain.add_argument("--json", action="store_true", help="print JSON")
    explain.set_defaults(run=_explain)

    errors = sub.add_parser("errors", help="print the error catalog")
    errors.add_argument("--json", action="store_true", help="print JSON")
    errors.set_defaults(run=_errors)

    demo = sub.add_parser("demo", help="run the bundled scenarios")
    demo.add_argument("--json", action="store_true", help="print JSON")
    demo.set_defaults(run=_demo)

    vectors = sub.add_parser("vectors", help="write the conformance vectors")
    vectors.add_argument("out", help="output JSON file ('-' for stdout)")
    vectors.set_defaults(run=_vectors)

    run = sub.add_parser("run-vectors", help="this implementation's results for vectors")
    run.add_argument("vectors", help="vectors JSON file")
    run.set_defaults(run=_run_vectors)

    check = sub.add_parser("check-vectors", help="compare another implementation's results")
    check.add_argument("vectors", help="vectors JSON file")
    check.add_argument("--results", required=True, help="their results JSON file")
    check.set_defaults(run=_check_vectors)

    tables = sub.add_parser("tables", help="render a docs table from the code")
    tables.add_argument("name", choices=sorted(TABLES))
    tables.add_argument("--write", metavar="DOC", help="splice the table into this markdown file")
    tables.set_defaults(run=_tables)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status.

    0: served (or done); 1: the policy refused the request, or vectors mismatched;
    2: unreadable input.
    """
    args = _parser().parse_args(argv)
    status: int = args.run(args, out or sys.stdout)
    return status
