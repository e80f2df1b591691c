"""``pd-policy``: explain a decision, list the errors, run the demo, write and check the
conformance vectors, render the docs tables.

Every input it cannot use ends the same way: one line on stderr naming the file
and the field, and exit status 2; never a traceback. The JSON formats it reads
are documented in ``docs/formats.md``, with example files in ``docs/examples/``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, TextIO

from pd_policy import __version__
from pd_policy.catalog import ERROR_CATALOG
from pd_policy.codec import request_from_json, worker_from_json
from pd_policy.connectors import KvConnectorMode
from pd_policy.errors import MalformedRequest, PolicyError
from pd_policy.jsontext import loads_strict

from .demo import demo_rows, demo_table, outcome_to_json, summarize_leg
from .outcome import PrefillResult, plan
from .scenarios import SCENARIOS
from .tables import TABLES, splice
from .vectors import build_vectors, compare_results, dumps, run_vectors

__all__ = ["EXIT_BROKEN_PIPE", "main", "outcome_to_json", "summarize_leg"]

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
#: A reader that went away (``pd-policy demo | head``): a shell's status for SIGPIPE.
EXIT_BROKEN_PIPE: Final = 141

_FORMATS: Final = (
    "JSON formats: docs/formats.md (request, worker, prefill KV, vectors, results); "
    "examples: docs/examples/."
)


class UsageError(Exception):
    """An input the command cannot use: its one-line message names the file and the field."""


def _load_json(path: str) -> Any:
    """The JSON document at ``path`` (``-``: stdin), strictly parsed."""
    name = "stdin" if path == "-" else path
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"{name}: cannot read ({exc.strerror or exc})") from None
    try:
        return loads_strict(raw, what="the document")
    except MalformedRequest as exc:
        raise UsageError(f"{name}: {exc.message}") from None


def _field_error(path: str, exc: PolicyError) -> UsageError:
    where = f"{exc.param}: " if exc.param and exc.param not in exc.message else ""
    return UsageError(f"{'stdin' if path == '-' else path}: {where}{exc.message}")


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot write ({exc.strerror or exc})") from None


def _short(salt: str | None, caller: str | None) -> str:
    if salt is None:
        return "none"
    if salt == caller:
        return "the caller's salt, unchanged"
    return salt[:16] + "..." if len(salt) > 16 else salt


def _explain(args: argparse.Namespace, out: TextIO) -> int:
    raw_request, raw_worker = _load_json(args.request), _load_json(args.decode_worker)
    prefill = None
    if args.prefill_kv is not None:
        returned = _load_json(args.prefill_kv)
        if not isinstance(returned, dict):
            raise UsageError(f"{args.prefill_kv}: the KV parameters must be a JSON object")
        try:
            prefill = PrefillResult.returned(returned, KvConnectorMode(args.kv_mode))
        except MalformedRequest as exc:
            raise _field_error(args.prefill_kv, exc) from None
    elif args.prefill_returned_nothing:
        prefill = PrefillResult.nothing(KvConnectorMode(args.kv_mode))
    try:
        request = request_from_json(raw_request)
    except MalformedRequest as exc:
        raise _field_error(args.request, exc) from None
    try:
        worker = worker_from_json(raw_worker)
    except MalformedRequest as exc:
        raise _field_error(args.decode_worker, exc) from None
    outcome = plan(request, worker, prefill)
    if args.json:
        out.write(json.dumps(outcome_to_json(outcome), indent=2) + "\n")
    elif outcome.error is not None:
        out.write(f"refused:     {outcome.status} {outcome.error.code}\n")
        out.write(json.dumps(outcome.error.to_body(), indent=2) + "\n")
    else:
        assert outcome.form is not None and outcome.leg is not None
        out.write(f"form:        {outcome.form.name}\n")
        out.write(f"decode leg:  {summarize_leg(outcome.leg)}\n")
        out.write(f"cache_salt:  {_short(outcome.cache_salt, request.cache_salt)}\n")
        out.write(f"upstream:    {_short(outcome.upstream_cache_salt, None)}\n")
        if not outcome.handoff_checked:
            out.write(
                "handoff:     not checked (give --prefill-kv or --prefill-returned-nothing)\n"
            )
    return EXIT_OK if outcome.ok else EXIT_REFUSED


def _errors(args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        rows = [
            {"code": e.code, "status": e.status, "retryable": e.retryable, "meaning": e.meaning}
            for e in ERROR_CATALOG.values()
        ]
        out.write(json.dumps(rows, indent=2) + "\n")
    else:
        out.write(TABLES["errors"]() + "\n")
    return EXIT_OK


def _demo(args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        results = [
            {"scenario": sc.name, **outcome_to_json(plan(sc.request, sc.decode_worker, sc.prefill))}
            for sc in SCENARIOS
        ]
        out.write(json.dumps(results, indent=2) + "\n")
        return EXIT_OK
    assert len(demo_rows()) == len(SCENARIOS) + 1
    out.write(f"pd-policy {__version__}: the decode leg of each request, per decode worker\n\n")
    out.write(demo_table() + "\n")
    return EXIT_OK


def _tables(args: argparse.Namespace, out: TextIO) -> int:
    table = TABLES[args.name]()
    if args.write is None:
        out.write(table + "\n")
        return EXIT_OK
    try:
        document = Path(args.write).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{args.write}: cannot read ({getattr(exc, 'strerror', exc)})") from None
    try:
        spliced = splice(document, args.name, table)
    except ValueError:
        raise UsageError(
            f"{args.write}: no generated block '{args.name}' (its BEGIN and END markers)"
        ) from None
    _write(args.write, spliced)
    return EXIT_OK


def _vectors(args: argparse.Namespace, out: TextIO) -> int:
    text = dumps(build_vectors())
    if args.out == "-":
        out.write(text)
    else:
        _write(args.out, text)
    return EXIT_OK


def _run_vectors(args: argparse.Namespace, out: TextIO) -> int:
    document = _load_json(args.vectors)
    try:
        results = run_vectors(document)
    except MalformedRequest as exc:
        raise _field_error(args.vectors, exc) from None
    out.write(dumps(results))
    return EXIT_OK


def _check_vectors(args: argparse.Namespace, out: TextIO) -> int:
    vectors, results = _load_json(args.vectors), _load_json(args.results)
    try:
        mismatches = compare_results(vectors, results)
    except MalformedRequest as exc:
        # The param says which document: cases[...] are the vectors', results[...] theirs.
        blame = args.results if (exc.param or "").startswith("results") else args.vectors
        raise _field_error(blame, exc) from None
    for mismatch in mismatches:
        out.write(f"MISMATCH {mismatch}\n")
    cases = {c["id"] for c in vectors["cases"]}
    failed = {m.case_id for m in mismatches} & cases  # results for no case fail no case
    out.write(f"{len(cases) - len(failed)} of {len(cases)} cases match\n")
    return EXIT_REFUSED if mismatches else EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pd-policy", description=__doc__.splitlines()[0], epilog=_FORMATS
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, run: Callable[..., int], help: str) -> argparse.ArgumentParser:
        sub_parser = sub.add_parser(name, help=help, description=help, epilog=_FORMATS)
        sub_parser.set_defaults(run=run)
        return sub_parser

    explain = command("explain", _explain, "explain the decode leg for a request and worker")
    explain.add_argument("request", help="request JSON file ('-' for stdin)")
    explain.add_argument("--decode-worker", required=True, help="decode worker JSON file")
    handoff = explain.add_mutually_exclusive_group()
    handoff.add_argument("--prefill-kv", help="JSON file: the KV parameters prefill returned")
    handoff.add_argument(
        "--prefill-returned-nothing", action="store_true", help="prefill returned no KV parameters"
    )
    explain.add_argument(
        "--kv-mode",
        choices=[m.value for m in KvConnectorMode],
        default="nixl",
        help="the prefill connector's handoff contract, whose fields the check requires",
    )
    explain.add_argument("--json", action="store_true", help="print JSON")
    command("errors", _errors, "print the error catalog").add_argument(
        "--json", action="store_true", help="print JSON"
    )
    command("demo", _demo, "run the bundled scenarios").add_argument(
        "--json", action="store_true", help="print JSON"
    )
    vectors = command("vectors", _vectors, "write the conformance vectors")
    vectors.add_argument("out", help="output JSON file ('-' for stdout)")
    run = command("run-vectors", _run_vectors, "this implementation's results for vectors")
    run.add_argument("vectors", help="vectors JSON file ('-' for stdin)")
    check = command("check-vectors", _check_vectors, "compare another implementation's results")
    check.add_argument("vectors", help="vectors JSON file")
    check.add_argument("--results", required=True, help="their results JSON file")
    tables = command("tables", _tables, "render a docs table from the code")
    tables.add_argument("name", choices=sorted(TABLES))
    tables.add_argument("--write", metavar="DOC", help="splice the table into this markdown file")
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status.

    0: served (or done); 1: the policy refused the request, or vectors mismatched;
    2: an input it cannot use (a one-line message on stderr); 141: its output was
    closed early.
    """
    args = _parser().parse_args(argv)
    stream = out or sys.stdout
    try:
        status: int = args.run(args, stream)
        stream.flush()
    except UsageError as exc:
        print(f"pd-policy: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader is gone: send what Python still holds for stdout nowhere, quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return status
