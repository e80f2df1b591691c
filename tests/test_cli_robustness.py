"""No input makes ``pd-policy`` print a traceback: generated malformed documents (wrong
shapes, deep nesting, unknown operations, bad encodings) and unusable output paths all
end in exit 2 and one line on stderr naming the file."""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pd_policy import PolicyError, request_to_json
from pd_policy.tools.cli import main
from pd_policy.tools.scenarios import image_request, mrope_request
from pd_policy.tools.vectors import build_vectors, run_vectors

VECTORS = build_vectors()


def _one_of_each(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # One case per operation and per set of fields, so a mutation can reach every reader.
    seen: dict[tuple[str, ...], dict[str, Any]] = {}
    for case in cases:
        key = (case["operation"], *sorted(case), *sorted(case.get("prefill", {})))
        seen.setdefault(key, case)
    return list(seen.values())


SMALL = {**VECTORS, "cases": _one_of_each(VECTORS["cases"])}
RESULTS = run_vectors(SMALL)
REQUEST = request_to_json(mrope_request())

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8,
)  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, base: Any, start: int = 1, into: str | None = None) -> Any:
    """``base`` with one node replaced by arbitrary JSON, or deleted, or a key added.

    The node is found by a random walk from the root that stops at each level with
    probability 2/5 once it is ``start`` deep: the fields of each record (a case of a
    vectors document, at depth 2) are hit as often as the leaves far below them. With
    ``into``, the walk starts at that key of the root (a document's list of records).
    """
    doc = copy.deepcopy(base)
    parent: Any = None
    key: Any = None
    node = doc
    depth = 0
    if into is not None:
        parent, key, node, depth = doc, into, doc[into], 1
    while isinstance(node, dict | list) and node:
        if depth >= start and draw(st.integers(0, 4)) < 2:
            break
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        parent, node, depth = node, node[key], depth + 1
    event(f"mutation depth {min(depth, 4)}")
    if parent is None:
        return draw(json_values)
    action = draw(st.sampled_from(["replace", "delete", "add"]))
    event(f"mutation: {action}")
    if action == "delete":
        del parent[key]
    elif action == "add" and isinstance(parent, dict):
        parent[draw(st.text(max_size=6))] = draw(json_values)
    else:
        parent[key] = draw(json_values)
    return doc


def documents(base: Any, start: int = 1, into: str | None = None) -> st.SearchStrategy[bytes]:
    """Mostly ``base`` with one node changed (so validation is reached deep inside), then
    arbitrary JSON, deep nesting, odd encodings and plain bytes."""
    near = mutated(base, start, into).map(lambda d: json.dumps(d).encode())
    anything = json_values.map(lambda d: json.dumps(d).encode())
    nested = st.integers(1, 100_000).map(lambda n: b"[" * n + b"]" * n)
    odd = st.sampled_from(
        [b"", b"\xff\xfe{", b'{"a": 1, "a": 2}', b"[NaN]", b"\x00", '{"é": 1}'.encode("utf-16")]
    )
    kinds = [near, near, near, near, near, near, anything, nested, odd, st.binary(max_size=32)]
    return st.sampled_from(range(len(kinds))).flatmap(lambda k: kinds[k])


def run_cli(tmp: Path, argv: list[str], files: dict[str, bytes]) -> tuple[int, str, str]:
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    out = io.StringIO()
    err = io.StringIO()
    saved = sys.stderr
    sys.stderr = err
    try:
        status = main(argv, out)  # any exception here fails the test: that is a traceback
    finally:
        sys.stderr = saved
    return status, out.getvalue(), err.getvalue()


def check(status: int, err: str, name: str, *, label: bool = True) -> None:
    assert status in (0, 1, 2)
    if label:
        event(f"exit {status}")
    if status == 2:
        assert err.count("\n") == 1 and err.startswith("pd-policy: ") and name in err, err
        assert "Traceback" not in err


FAST = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(request=documents(REQUEST), worker=documents({"supports_vision": False}),
       kv=documents({"do_remote_prefill": True}))  # fmt: skip
def test_explain_never_tracebacks(tmp_path: Path, request: bytes, worker: bytes, kv: bytes) -> None:
    argv = ["explain", str(tmp_path / "r.json"), "--decode-worker", str(tmp_path / "w.json"),
            "--prefill-kv", str(tmp_path / "k.json")]  # fmt: skip
    status, _, err = run_cli(tmp_path, argv, {"r.json": request, "w.json": worker, "k.json": kv})
    check(status, err, str(tmp_path))


def test_a_key_with_a_line_break_is_still_one_line(tmp_path: Path) -> None:
    # Found by the CI profile: a worker document {"\n": null} printed a two-line error.
    argv = ["explain", str(tmp_path / "r.json"), "--decode-worker", str(tmp_path / "w.json")]
    files = {"r.json": json.dumps(REQUEST).encode(), "w.json": b'{"\\n": null}'}
    status, _, err = run_cli(tmp_path, argv, files)
    assert status == 2
    check(status, err, str(tmp_path), label=False)
    assert '"\\n": unknown field' in err


@FAST
@given(document=documents(SMALL, start=2, into="cases"))
def test_run_vectors_never_tracebacks(tmp_path: Path, document: bytes) -> None:
    status, _, err = run_cli(tmp_path, ["run-vectors", str(tmp_path / "v.json")],
                             {"v.json": document})  # fmt: skip
    check(status, err, "v.json")


@FAST
@given(
    vectors=documents(SMALL, start=2, into="cases"),
    results=documents(RESULTS, start=2, into="results"),
)
def test_check_vectors_never_tracebacks(tmp_path: Path, vectors: bytes, results: bytes) -> None:
    argv = ["check-vectors", str(tmp_path / "v.json"), "--results", str(tmp_path / "r.json")]
    status, _, err = run_cli(tmp_path, argv, {"v.json": vectors, "r.json": results})
    check(status, err, str(tmp_path))


@pytest.mark.parametrize(
    ("case", "why"),
    [({"id": "x", "operation": "teleport"}, "unknown operation"),
     ({"id": "x", "operation": "plan", "decode_worker": {}}, "request"),
     ({"id": "x"}, "operation"), ({"operation": "plan"}, "id"), ([1], "object"),
     ({"id": "x", "operation": "fold_salt", "identities": [["smell", "h"]]}, "modality"),
     ({"id": "x", "operation": "kv_handoff", "prefill_kv": {"mode": "carrier-pigeon"}, "n": 1},
      "prefill_kv.mode")],
)  # fmt: skip
def test_a_case_of_the_wrong_shape_names_the_case_and_the_field(
    tmp_path: Path, case: Any, why: str
) -> None:
    document = json.dumps({"cases": [case]}).encode()
    status, _, err = run_cli(tmp_path, ["run-vectors", str(tmp_path / "v.json")],
                             {"v.json": document})  # fmt: skip
    assert status == 2 and "cases[0]" in err and why in err, err


def test_unusable_outputs_are_one_line(tmp_path: Path) -> None:
    target = tmp_path / "a-directory"
    target.mkdir()
    for argv in (
        ["vectors", str(target)],
        ["vectors", str(tmp_path / "missing" / "v.json")],
        ["tables", "errors", "--write", str(tmp_path / "missing.md")],
        ["tables", "errors", "--write", str(target)],
    ):
        status, _, err = run_cli(tmp_path, argv, {})
        check(status, err, str(tmp_path), label=False)
        assert status == 2
    (tmp_path / "plain.md").write_text("# no generated block here\n")
    status, _, err = run_cli(tmp_path, ["tables", "errors", "--write", str(tmp_path / "plain.md")],
                             {})  # fmt: skip
    assert status == 2 and "markers" in err


def test_a_closed_pipe_ends_quietly() -> None:
    # `pd-policy demo | head -1`: the reader leaves after one line.
    done = subprocess.run(
        f"{sys.executable} -m pd_policy.tools demo | head -c 1", shell=True,
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.stderr == "" and done.stdout == "p"
    big = subprocess.run(
        f"{sys.executable} -m pd_policy.tools vectors - | head -c 10", shell=True,
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert big.stderr == "", big.stderr


def test_help_links_the_formats() -> None:
    for argv in (["--help"], ["explain", "--help"], ["check-vectors", "--help"]):
        out = io.StringIO()
        saved, sys.stdout = sys.stdout, out
        try:
            with pytest.raises(SystemExit):
                main(argv)
        finally:
            sys.stdout = saved
        assert "docs/formats.md" in out.getvalue()


def test_the_image_example_still_explains(tmp_path: Path) -> None:
    path = tmp_path / "image.json"
    path.write_text(json.dumps(request_to_json(image_request())))
    worker = tmp_path / "w.json"
    worker.write_text('{"supports_vision": false}')
    status, out, err = run_cli(tmp_path, ["explain", str(path), "--decode-worker", str(worker)],
                               {})  # fmt: skip
    assert (status, err) == (0, "") and "TEXT_PLUS_HASHES" in out


_ILL_TYPED: tuple[Any, ...] = (None, True, -1, 2**40, "x", [], {}, [1, "a"], {"k": []})


def _field_paths(node: Any, depth: int) -> list[tuple[Any, ...]]:
    if depth == 0 or not isinstance(node, dict | list) or not node:
        return []
    keys = sorted(node) if isinstance(node, dict) else range(min(len(node), 2))
    out: list[tuple[Any, ...]] = []
    for key in keys:
        out.append((key,))
        out += [(key, *rest) for rest in _field_paths(node[key], depth - 1)]
    return out


def test_every_field_of_every_operation_refused_without_a_traceback() -> None:
    # Systematic where the generated documents above are random: every field (and its
    # fields) of one case per operation, deleted or replaced by each ill-typed value.
    tried = 0
    for case in SMALL["cases"]:
        for path in _field_paths(case, 3):
            for value in (*_ILL_TYPED, KeyError):
                broken = copy.deepcopy(case)
                parent = broken
                for key in path[:-1]:
                    parent = parent[key]
                if value is KeyError:
                    del parent[path[-1]]
                else:
                    parent[path[-1]] = value
                try:
                    run_vectors({"cases": [broken]})
                except PolicyError as exc:
                    assert exc.status == 400 and (exc.param or "").startswith("cases[0]")
                tried += 1
    assert tried > 1_000


def test_check_vectors_counts_cases_not_stray_results(tmp_path: Path) -> None:
    # Results for ids that are no case are mismatches, but they fail no case.
    extra = {**RESULTS, "results": RESULTS["results"] + [{"id": "nope", "outcome": {}}] * 2}
    files = {"v.json": json.dumps(SMALL).encode(), "r.json": json.dumps(extra).encode()}
    argv = ["check-vectors", str(tmp_path / "v.json"), "--results", str(tmp_path / "r.json")]
    status, out, _ = run_cli(tmp_path, argv, files)
    total = len(SMALL["cases"])
    assert status == 1 and out.endswith(f"{total} of {total} cases match\n")
