"""docs/formats.md and docs/examples/ say what the code reads.

The CLI runs on every example file, as the page shows it; every field the
request and worker tables name is one the codec takes (and the codec takes no
field they leave out); the page's rules on null and on uint32 integers hold.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pd_policy.codec import request_from_json, request_to_json, worker_from_json
from pd_policy.errors import PolicyError
from pd_policy.tools.cli import main
from pd_policy.tools.vectors import VECTORS_VERSION

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "formats.md"
EXAMPLES = ROOT / "docs" / "examples"
VECTORS = ROOT / "tests" / "vectors" / "pd-policy-vectors.json"
UINT32_MAX = 2**32 - 1


def run(*args: str) -> tuple[int, str]:
    """The CLI in this process: its exit status and what it printed."""
    out = io.StringIO()
    status = main(list(args), out=out)
    return status, out.getvalue()


def example(name: str) -> str:
    return str(EXAMPLES / name)


def load(name: str) -> Any:
    return json.loads((EXAMPLES / name).read_text(encoding="utf-8"))


# --- the CLI on the examples --------------------------------------------------------


EXPLAIN = [
    # (request, worker, handoff option, exit status, what the output must say)
    ("request-image.json", "worker-lm-only.json", "kv", 0, "TEXT_PLUS_HASHES"),
    ("request-image.json", "worker-lm-only.json", "nothing", 1,
     "502 pd_decode_missing_kv_transfer_params"),
    ("request-image.json", "worker-vision.json", None, 0, "IDENTITY_ONLY"),
    ("request-mrope.json", "worker-lm-only.json", None, 1,
     "400 pd_decode_language_model_only_mrope"),
    ("request-mrope.json", "worker-lm-only-metadata.json", "kv", 0, "MROPE_METADATA"),
]  # fmt: skip


# How the page's table writes each handoff option.
FLAGS = {
    "kv": " --prefill-kv $E/prefill-kv.json",
    "nothing": " --prefill-returned-nothing",
    None: "",
}


def _explain_args(request: str, worker: str, handoff: str | None) -> list[str]:
    args = ["explain", example(request), "--decode-worker", example(worker)]
    if handoff == "kv":
        args += ["--prefill-kv", example("prefill-kv.json")]
    elif handoff == "nothing":
        args.append("--prefill-returned-nothing")
    return args


@pytest.mark.parametrize(("request_file", "worker", "handoff", "status", "says"), EXPLAIN)
def test_explain_on_the_examples(
    request_file: str, worker: str, handoff: str | None, status: int, says: str
) -> None:
    code, text = run(*_explain_args(request_file, worker, handoff))
    assert code == status, text
    assert says in text
    # The page's table of commands lists this one, with its result and exit status.
    command = f"pd-policy explain $E/{request_file} --decode-worker $E/{worker}{FLAGS[handoff]}"
    (row,) = [
        line for line in DOC.read_text(encoding="utf-8").splitlines() if command + "`" in line
    ]
    assert says.split()[-1] in row and row.rstrip().endswith(f"| {status} |")


def test_explain_json_relays_the_prefill_kv_file_and_keeps_the_format() -> None:
    code, text = run(*_explain_args("request-image.json", "worker-lm-only.json", "kv"), "--json")
    assert code == 0
    outcome = json.loads(text)
    assert outcome["form"] == "text_plus_hashes"
    leg = request_from_json(outcome["decode_leg"])
    assert leg.kv_transfer_params_dict() == load("prefill-kv.json")
    assert leg.cache_salt == load("request-image.json")["cache_salt"]
    assert outcome["cache_salt"].startswith("mm1:")


def test_run_vectors_writes_the_results_example() -> None:
    code, text = run("run-vectors", example("vectors-small.json"))
    assert code == 0
    assert text == (EXAMPLES / "results-example.json").read_text(encoding="utf-8"), (
        "regenerate: pd-policy run-vectors docs/examples/vectors-small.json "
        "> docs/examples/results-example.json"
    )
    results = json.loads(text)
    assert results["format"] == "pd-policy-conformance-vectors-results"
    assert results["version"] == VECTORS_VERSION


def test_check_vectors_accepts_the_results_example() -> None:
    code, text = run(
        "check-vectors", example("vectors-small.json"), "--results", example("results-example.json")
    )
    assert (code, text) == (0, "3 of 3 cases match\n")


def _check(tmp_path: Path, results: dict[str, Any]) -> tuple[int, list[str]]:
    theirs = tmp_path / "theirs.json"
    theirs.write_text(json.dumps(results), encoding="utf-8")
    code, text = run("check-vectors", example("vectors-small.json"), "--results", str(theirs))
    return code, text.splitlines()


def test_check_vectors_reports_what_differs(tmp_path: Path) -> None:
    results = load("results-example.json")
    results["results"][1]["outcome"]["status"] = 500
    del results["results"][2]
    code, lines = _check(tmp_path, results)
    assert code == 1
    assert lines == [
        "MISMATCH decision/mrope_n1/lm_only: status: expected 400, got 500",
        "MISMATCH handoff/image/nothing/lm_only: no result",
        "1 of 3 cases match",
    ]


def test_check_vectors_reports_a_result_for_no_case(tmp_path: Path) -> None:
    results = load("results-example.json")
    results["results"].append({"id": "not/a/case", "outcome": {"status": 200}})
    code, lines = _check(tmp_path, results)
    assert code == 1
    assert "MISMATCH not/a/case: not a case of these vectors" in lines


def test_the_small_vectors_are_cases_of_the_committed_set() -> None:
    small, full = load("vectors-small.json"), json.loads(VECTORS.read_text(encoding="utf-8"))
    assert {k: v for k, v in small.items() if k != "cases"} == {
        k: v for k, v in full.items() if k != "cases"
    }
    committed = {case["id"]: case for case in full["cases"]}
    assert len(small["cases"]) == 3
    for case in small["cases"]:
        assert case == committed[case["id"]]


def test_the_vectors_tables_give_the_current_versions() -> None:
    text = DOC.read_text(encoding="utf-8")
    full = json.loads(VECTORS.read_text(encoding="utf-8"))
    for field in ("version", "salt_fold_version"):
        rows = [line for line in text.splitlines() if line.startswith(f"| `{field}` | integer")]
        assert rows, field
        for row in rows:
            assert f"`{full[field]}`" in row, field
    assert full["version"] == VECTORS_VERSION


# --- the field tables ---------------------------------------------------------------


def table_fields(heading: str) -> list[str]:
    """The first column of the first table under ``heading`` in docs/formats.md."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading)
    fields: list[str] = []
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if m := re.match(r"^\| `([a-z_]+)` \|", line):
            fields.append(m[1])
        elif fields:
            break
    assert fields, f"no table under {heading!r}"
    return fields


IDS = [1, 2, 3, 4, 5, 6]
TENSOR = {"shape": [1, 3], "dtype": "int64", "location": "inline", "nbytes": 24}

# A valid value for each field of each table, and where the field sits in a request.
SAMPLES: dict[str, dict[str, Any]] = {
    "## Request": {
        "request_id": "r",
        "input_ids": IDS,
        "text": "hello",
        "batches": [{"mm_hashes": ["h"]}],
        "media_refs": [{"url": "https://example.com/a.png"}],
        "n": 2,
        "kv_transfer_params": {"remote_engine_id": "p0"},
        "kv_transfer_params_legacy": {"remote_host": "h", "remote_port": 1},
        "cache_salt": "tenant",
    },
    "### Batch": {
        "modality": "video",
        "pixel_values": TENSOR,
        "tensors": {"image_grid_thw": TENSOR},
        "placeholders": [{"offset": 1, "length": 2}],
        "mm_hashes": ["h"],
        "im_token_id": 7,
        "batched_keys": ["pixel_values"],
        "flat_keys": {"pixel_values": "sizes"},
        "keep_on_cpu_keys": ["image_grid_thw"],
        "encoder_input_key": "patches",
    },
    "### Tensor": TENSOR,
    "### Media reference": {"url": "https://example.com/a.png", "modality": "audio"},
    "### Legacy KV parameters": {"remote_host": "h", "remote_port": 65535},
    "## Worker": {
        "supports_vision": False,
        "accepts_mm_metadata": True,
        "ec_role": "consumer",
        "kv_load": "content",
        "kv_load_failure_policy": "recompute",
        "mm_processor": "inprocess",
        "mm_media_ref_schemes": ["https"],
    },
}
REQUIRED: dict[str, dict[str, Any]] = {
    "## Request": {"request_id": "r", "input_ids": IDS},
    "### Batch": {},
    "### Tensor": {"shape": [1], "dtype": "float32"},
    "### Media reference": {"url": "https://example.com/a.png"},
    "### Legacy KV parameters": {"remote_host": "h", "remote_port": 1},
    "## Worker": {},
}


def decode(heading: str, obj: dict[str, Any]) -> None:
    """Decode ``obj`` as a part of the kind ``heading`` names, inside a minimal request."""
    if heading == "## Worker":
        worker_from_json(obj)
        return
    request: dict[str, Any] = {"request_id": "r", "input_ids": IDS}
    if heading == "## Request":
        request = obj
    elif heading == "### Batch":
        request["batches"] = [obj]
    elif heading == "### Tensor":
        request["batches"] = [{"tensors": {"t": obj}}]
    elif heading == "### Media reference":
        request["media_refs"] = [obj]
    else:
        request["kv_transfer_params_legacy"] = obj
    request_from_json(request)


def path_of(heading: str, field: str) -> str:
    """The ``param`` the codec names for ``field`` of the part ``heading`` names."""
    prefix = {
        "## Request": "",
        "## Worker": "",
        "### Batch": "batches[0].",
        "### Tensor": "batches[0].tensors.t.",
        "### Media reference": "media_refs[0].",
        "### Legacy KV parameters": "kv_transfer_params_legacy.",
    }[heading]
    return prefix + field


@pytest.mark.parametrize("heading", list(SAMPLES))
def test_every_documented_field_is_accepted(heading: str) -> None:
    assert table_fields(heading) == list(SAMPLES[heading])
    for field, value in SAMPLES[heading].items():
        obj = {**REQUIRED[heading], field: value}
        if heading == "## Request" and field == "text":
            del obj["input_ids"]
        if heading == "## Request" and field == "media_refs":
            obj.pop("batches", None)
        decode(heading, obj)
    decode(heading, {**REQUIRED[heading]})


@pytest.mark.parametrize("heading", list(SAMPLES))
def test_an_unknown_field_is_refused_by_its_path(heading: str) -> None:
    with pytest.raises(PolicyError) as caught:
        decode(heading, {**REQUIRED[heading], "priority": 1})
    assert (caught.value.code, caught.value.param) == (
        "pd_invalid_request",
        path_of(heading, "priority"),
    )


def test_the_tables_name_every_field_the_codec_writes() -> None:
    """Encoding a request that sets everything writes no field the tables leave out."""
    full = {**SAMPLES["## Request"], "batches": [SAMPLES["### Batch"]]}
    del full["text"], full["media_refs"]
    encoded = request_to_json(request_from_json(full))
    refs = {"request_id": "r", "input_ids": IDS, "media_refs": [SAMPLES["### Media reference"]]}
    with_refs = request_to_json(request_from_json(refs))
    assert set(encoded) | set(with_refs) | {"text"} == set(table_fields("## Request"))
    assert set(encoded["batches"][0]) == set(table_fields("### Batch"))
    assert set(encoded["batches"][0]["pixel_values"]) == set(table_fields("### Tensor"))
    assert set(with_refs["media_refs"][0]) == set(table_fields("### Media reference"))
    legacy = encoded["kv_transfer_params_legacy"]
    assert set(legacy) == set(table_fields("### Legacy KV parameters"))


# --- the reading rules --------------------------------------------------------------


def null_means_absent() -> set[str]:
    """The fields the reading rules list as taking null for "absent"."""
    text = DOC.read_text(encoding="utf-8")
    rule = text[text.index("- **`null`**") :].split("\n- ", 1)[0]
    return set(re.findall(r"`([a-z_]+)`", rule)) - {"null"}


def test_null_is_absent_exactly_for_the_fields_the_rules_list() -> None:
    listed = null_means_absent()
    assert len(listed) == 13
    for heading, samples in SAMPLES.items():
        required = REQUIRED[heading]
        for field in samples:
            if field in required:
                continue
            obj = {**required, field: None}
            if field in listed:
                decode(heading, obj)
            else:
                with pytest.raises(PolicyError) as caught:
                    decode(heading, obj)
                assert caught.value.param == path_of(heading, field)


@pytest.mark.parametrize(
    ("heading", "field", "value"),
    [
        ("## Request", "input_ids", [UINT32_MAX + 1]),
        ("## Request", "n", UINT32_MAX + 1),
        ("### Batch", "im_token_id", UINT32_MAX + 1),
        ("### Batch", "placeholders", [{"offset": UINT32_MAX + 1, "length": 1}]),
        ("### Batch", "placeholders", [{"offset": 0, "length": UINT32_MAX + 1}]),
        ("### Tensor", "shape", [UINT32_MAX + 1]),
        ("## Request", "n", True),
        ("## Request", "n", 1.0),
    ],
)
def test_integers_are_json_integers_within_uint32(heading: str, field: str, value: Any) -> None:
    with pytest.raises(PolicyError) as caught:
        decode(heading, {**REQUIRED[heading], field: value})
    assert caught.value.code == "pd_invalid_request"
    assert (caught.value.param or "").startswith(path_of(heading, field))


def test_the_largest_uint32_is_taken() -> None:
    decode("## Request", {"request_id": "r", "input_ids": [UINT32_MAX], "n": UINT32_MAX})
    decode("### Tensor", {"shape": [UINT32_MAX], "dtype": "uint8"})


def test_the_example_files_decode() -> None:
    for path in sorted(EXAMPLES.glob("request-*.json")):
        request_from_json(load(path.name))
    for path in sorted(EXAMPLES.glob("worker-*.json")):
        worker_from_json(load(path.name))
    # Every example the page links to exists.
    for name in re.findall(r"\]\(examples/([^)]+)\)", DOC.read_text(encoding="utf-8")):
        assert (EXAMPLES / name).is_file(), name
