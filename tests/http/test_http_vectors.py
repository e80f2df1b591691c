"""The HTTP conformance vectors: current, deterministic, and covering every outcome."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pd_policy import DecodeForm
from pd_policy_vllm.openai.tools import vectors

COMMITTED = Path(__file__).resolve().parents[1] / "vectors" / "pd-policy-http-vectors.json"


def test_the_committed_vectors_are_what_the_code_produces() -> None:
    # A change that alters them must be deliberate: `make vectors`, and say why.
    assert COMMITTED.read_text(encoding="utf-8") == vectors.dumps(vectors.build())


def test_this_implementation_passes_them() -> None:
    document = json.loads(COMMITTED.read_text(encoding="utf-8"))
    results = {r["id"]: r["outcome"] for r in vectors.run(document)["results"]}
    assert results == {c["id"]: c["expected"] for c in document["cases"]}


def test_they_reach_every_http_form_and_refusal() -> None:
    document = json.loads(COMMITTED.read_text(encoding="utf-8"))
    outcomes = [c["expected"] for c in document["cases"]]
    forms = {o["form"] for o in outcomes if o["status"] == 200}
    assert forms == {f.value for f in DecodeForm}
    codes = {o["error_code"] for o in outcomes if o["status"] != 200}
    assert codes >= {
        "pd_invalid_request",
        "pd_decode_language_model_only_mrope",
        "pd_decode_language_model_only_n_samples",
        "pd_decode_missing_kv_transfer_params",
        "prefill_stream_error",
    }
    # A stripped chat leg never carries a media part, and always the ids and a salt.
    for case in document["cases"]:
        outcome = case["expected"]
        if outcome.get("form") != "text_plus_hashes" or case["route"] != "/v1/chat/completions":
            continue
        body = outcome["decode_leg"]["body"]
        parts = [
            p for m in body["messages"] if isinstance(m["content"], list) for p in m["content"]
        ]
        assert all(p["type"] == "text" for p in parts)
        if case["body"].get("n", 1) == 1:
            assert body["kv_transfer_params"]["prompt_token_ids"]
    # A metadata leg goes to generate with the grids and no pixels; its prefill got them.
    metadata = [c for c in document["cases"] if c["expected"].get("form") == "mrope_metadata"]
    assert len(metadata) >= 4
    for case in metadata:
        outcome = case["expected"]
        assert outcome["decode_leg"]["route"] == "/inference/v1/generate"
        assert "PIXELS" not in json.dumps(outcome["decode_leg"]) and "GRID" in json.dumps(outcome)
        assert "PIXELS" in json.dumps(outcome["prefill_leg"])


def test_the_command_writes_and_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "v.json"
    assert vectors.main(["write", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == COMMITTED.read_text(encoding="utf-8")
    assert vectors.main(["run", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "pd-policy-http-vectors-results"
    assert vectors.main(["nonsense"]) == 2
