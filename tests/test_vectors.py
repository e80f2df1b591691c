"""The conformance vectors: current, deterministic, complete, and checkable."""

from __future__ import annotations

import io
import json
from pathlib import Path

from pd_policy import ERROR_CATALOG, DecodeForm
from pd_policy.tools.cli import main
from pd_policy.tools.vectors import FORMAT, build_vectors, compare_results, dumps, run_vectors

COMMITTED = Path(__file__).resolve().parent / "vectors" / "pd-policy-vectors.json"


def test_the_committed_vectors_are_what_the_code_produces() -> None:
    # A change that alters them must be deliberate: `make vectors`, and say why.
    assert COMMITTED.read_text(encoding="utf-8") == dumps(build_vectors())


def test_the_same_release_writes_the_same_bytes() -> None:
    assert dumps(build_vectors()) == dumps(build_vectors())


def test_the_vectors_cover_every_form_and_every_policy_error() -> None:
    document = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert document["format"] == FORMAT
    outcomes = [c["expected"] for c in document["cases"]]
    assert {o.get("form") for o in outcomes} >= {f.value for f in DecodeForm}
    transport = {f"{leg}_{what}" for leg in ("encode", "prefill", "decode")
                 for what in ("worker_failed_to_start", "stream_error")}  # fmt: skip
    # What a fetch met is I/O, which no pure operation shows (tests/http/test_http_pin.py),
    # and a key, a body's size and a client's time are the front door's
    # (tests/http/test_http_fleet.py, tests/http/test_http_front_door.py), as is a connection
    # past the cap of client connections.
    fetched = {"pd_media_fetch_failed", "pd_media_unreachable", "pd_unauthorized", "pd_forbidden",
               "pd_body_too_large", "pd_client_timeout", "pd_overloaded"}  # fmt: skip
    assert {o.get("error_code") for o in outcomes} >= set(ERROR_CATALOG) - transport - fetched
    ids = [c["id"] for c in document["cases"]]
    assert len(ids) == len(set(ids))
    # Every cell of the decision table: 10 request shapes by 6 worker kinds (two of them
    # blind to a stripped leg: a hash-matched decode, a recomputing one).
    assert sum(i.startswith("decision/") for i in ids) == 60


def test_adversarial_salts_never_collide() -> None:
    document = json.loads(COMMITTED.read_text(encoding="utf-8"))
    salted = [c for c in document["cases"] if c["id"].startswith(("salt/", "fold_salt/"))]
    folded = [c["expected"]["cache_salt"] for c in salted if c["expected"].get("cache_salt")]
    folded = [s for s in folded if s.startswith("mm1:")]
    assert len(folded) == len(set(folded)) > 20
    upstream = {c["id"]: c["expected"]["upstream_cache_salt"] for c in salted}
    # The upstream format is ambiguous, which is why ours exists.
    assert upstream["fold_salt/split_vs_joined_a"] == upstream["fold_salt/split_vs_joined_b"]


def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def test_check_vectors_accepts_a_matching_implementation(tmp_path: Path) -> None:
    status, text = run_cli("run-vectors", str(COMMITTED))
    assert status == 0
    results = tmp_path / "ours.json"
    results.write_text(text)
    status, report = run_cli("check-vectors", str(COMMITTED), "--results", str(results))
    assert status == 0
    assert report.strip().endswith("cases match")
    assert "MISMATCH" not in report


def test_check_vectors_prints_each_mismatch(tmp_path: Path) -> None:
    document = json.loads(COMMITTED.read_text(encoding="utf-8"))
    results = run_vectors(document)
    first, second = results["results"][0], results["results"][1]
    first["outcome"] = {**first["outcome"], "status": 599}
    results["results"].remove(second)
    results["results"].append({"id": "made/up", "outcome": {}})
    theirs = tmp_path / "theirs.json"
    theirs.write_text(json.dumps(results))
    mismatches = compare_results(document, results)
    assert {m.case_id for m in mismatches} == {first["id"], second["id"], "made/up"}
    status, report = run_cli("check-vectors", str(COMMITTED), "--results", str(theirs))
    assert status == 1
    assert f"MISMATCH {first['id']}: status: expected" in report
    assert f"MISMATCH {second['id']}: no result" in report


def test_vectors_command_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "v.json"
    assert run_cli("vectors", str(out))[0] == 0
    assert out.read_text(encoding="utf-8") == COMMITTED.read_text(encoding="utf-8")
