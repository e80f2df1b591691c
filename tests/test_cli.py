"""The ``pd-policy`` command, run in-process and as ``python -m pd_policy.tools``."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pd_policy import ERROR_CATALOG, request_to_json
from pd_policy.tools.cli import main
from pd_policy.tools.scenarios import SCENARIOS, image_request, mrope_request


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = main(list(argv), out)
    return status, out.getvalue()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    paths = {}
    for name, doc in {
        "image": request_to_json(image_request(cache_salt="tenant-secret")),
        "mrope": request_to_json(mrope_request()),
        "lm_only": {"supports_vision": False},
        "vision": {"supports_vision": True},
        "kv": {"do_remote_prefill": True, "transfer_id": "t"},
        "kv_empty": {},
        "bad": {"request_id": "r", "input_ids": [1], "n": "two"},
    }.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        paths[name] = str(path)
    return paths


def test_explain_refuses_a_handoff_without_its_connectors_fields(
    files: dict[str, str],
) -> None:
    # The TransferConnector's handoff names no NIXL blocks; {} names nothing under any mode.
    for kv, mode in (("kv", "nixl"), ("kv_empty", "passthrough"), ("kv_empty", "transfer")):
        status, out = run(
            "explain", files["image"], "--decode-worker", files["lm_only"], "--prefill-kv",
            files[kv], "--kv-mode", mode,
        )  # fmt: skip
        assert status == 1
        assert "pd_decode_missing_kv_transfer_params" in out


def test_explain_a_stripped_leg(files: dict[str, str]) -> None:
    status, out = run(
        "explain", files["image"], "--decode-worker", files["lm_only"], "--prefill-kv",
        files["kv"], "--kv-mode", "transfer",
    )  # fmt: skip
    assert status == 0
    assert "TEXT_PLUS_HASHES" in out
    assert "1 hash, KV" in out
    assert "mm1:" in out
    assert "tenant-secret" not in out


def test_explain_json(files: dict[str, str]) -> None:
    status, out = run("explain", files["image"], "--decode-worker", files["lm_only"], "--json")
    doc = json.loads(out)
    assert status == 0
    assert doc["form"] == "text_plus_hashes"
    assert doc["decode_leg"]["batches"] == [
        {"modality": "image", "mm_hashes": [image_request().batches[0].mm_hashes[0]]}
    ]
    assert doc["cache_salt"].startswith("mm1:")
    assert doc["upstream_cache_salt"].startswith("mm:")


def test_explain_refusals(files: dict[str, str]) -> None:
    status, out = run("explain", files["mrope"], "--decode-worker", files["lm_only"])
    assert status == 1
    assert "400 pd_decode_language_model_only_mrope" in out
    status, out = run(
        "explain",
        files["image"],
        "--decode-worker",
        files["lm_only"],
        "--prefill-returned-nothing",
        "--json",
    )
    assert (status, json.loads(out)["status"]) == (1, 502)


def test_explain_a_malformed_request_is_an_input_error_naming_file_and_field(
    files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # A request the codec refuses is the command's input error (2), not a refusal (1).
    status, out = run("explain", files["bad"], "--decode-worker", files["vision"], "--json")
    assert (status, out) == (2, "")
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and files["bad"] in line and "n:" in line


def test_explain_unreadable_input(files: dict[str, str], tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert run("explain", str(broken), "--decode-worker", files["vision"])[0] == 2
    assert (
        run("explain", str(tmp_path / "missing.json"), "--decode-worker", files["vision"])[0] == 2
    )


def test_errors_lists_the_catalog() -> None:
    status, out = run("errors", "--json")
    assert status == 0
    assert [row["code"] for row in json.loads(out)] == list(ERROR_CATALOG)


def test_demo_runs_every_scenario() -> None:
    status, out = run("demo", "--json")
    rows = json.loads(out)
    assert status == 0
    assert [r["scenario"] for r in rows] == [s.name for s in SCENARIOS]
    assert [r["status"] for r in rows] == [200, 200, 400, 200, 400, 400, 200, 502, 200]
    assert [r.get("form") or r["error"]["code"] for r in rows] == [
        "identity_only",
        "text_plus_hashes",
        "pd_decode_language_model_only_mrope",
        "mrope_metadata",
        "pd_decode_language_model_only_media_refs",
        "pd_decode_language_model_only_n_samples",
        "text_plus_hashes",
        "pd_decode_missing_kv_transfer_params",
        "text_plus_hashes",
    ]
    status, table = run("demo")
    lines = table.splitlines()
    assert status == 0 and max(map(len, lines)) <= 100  # fits a terminal, legend included
    assert sum(line[:1].isdigit() for line in lines) == len(SCENARIOS)
    for short in ("missing_kv", "LM+meta", "refused: mrope", "pl: placeholder ranges"):
        assert short in table  # each short form is in the table and the legend explains it


def test_python_dash_m() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pd_policy.tools", "errors"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "pd_decode_missing_kv_transfer_params" in done.stdout
