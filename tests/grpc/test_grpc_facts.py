"""The one-pass wire scan: its facts are the core's, and its check refuses exactly what the
core's own validators refuse."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from proto_strategies import protos

import pd_policy
from pd_policy import LegacyKvParams, MalformedRequest, MediaRef, MultimodalBatch, Request
from pd_policy_grpc import read_facts, request_view
from pd_policy_grpc.facts import check_generate_request, scan
from pd_policy_grpc.view import batches_with_paths, tensor_descriptor
from pd_policy_grpc.wire import modality_from_wire, pb


@given(protos())
def test_the_facts_are_the_cores(proto: pb.GenerateRequest) -> None:
    view = request_view(proto)
    facts = read_facts(proto)
    assert facts == read_facts(proto, check=False)
    assert facts.has_mm_inputs == view.has_mm_inputs
    assert facts.has_media_refs == bool(view.media_refs)
    assert facts.has_mrope_grids == pd_policy.has_mrope_grids(view)
    assert max(facts.n, 1) == view.n
    assert scan(proto).hashes == [list(b.mm_hashes) for b in view.batches]


def core_verdict(proto: pb.GenerateRequest) -> bool:
    """Whether the core's validators accept the message: an oracle independent of the scan."""
    try:
        batches = []
        for _, batch in batches_with_paths(proto):
            modality = modality_from_wire(batch.modality)
            if modality is None:
                return False
            batches.append(
                MultimodalBatch(
                    modality=modality,
                    tensors=[
                        tensor_descriptor(k, v) for k, v in batch.model_specific_tensors.items()
                    ],
                    placeholders=[
                        pd_policy.PlaceholderRange(p.offset, p.length)
                        for p in batch.mm_placeholders
                    ],
                    mm_hashes=tuple(batch.mm_hashes),
                )
            )
        refs = []
        for ref in proto.media_refs.items:
            modality = modality_from_wire(ref.modality)
            if modality is None:
                return False
            refs.append(MediaRef(modality, ref.url))
        which = proto.WhichOneof("input")
        Request(
            "r",
            input_ids=tuple(proto.tokenized.input_ids) if which == "tokenized" else None,
            text=proto.text if which == "text" else None,
            batches=batches,
            media_refs=refs,
            kv_transfer_params=(
                proto.kv_transfer_params_json if proto.HasField("kv_transfer_params_json") else None
            ),
            kv_legacy=LegacyKvParams("h", 1),
        )
    except MalformedRequest:
        return False
    return True


corruptions = st.sampled_from(
    ["placeholder_zero", "placeholder_past", "empty_hash", "modality", "kv_list", "kv_text",
     "kv_padded", "kv_trailing", "refs_with_batches", "ref_no_url", "no_input", "count"]
)  # fmt: skip


def corrupt(proto: pb.GenerateRequest, how: str) -> None:
    batch = proto.mm_inputs
    if how == "placeholder_zero":
        batch.mm_placeholders.add(offset=0, length=0)
    elif how == "placeholder_past":
        batch.mm_placeholders.add(offset=len(proto.tokenized.input_ids), length=1)
    elif how == "empty_hash":
        batch.mm_hashes.append("")
    elif how == "modality":
        batch.modality = 99
    elif how == "kv_list":
        proto.kv_transfer_params_json = "[1]"
    elif how == "kv_text":
        proto.kv_transfer_params_json = "{not json"
    elif how == "kv_padded":
        proto.kv_transfer_params_json = ' \n{"a": 1}'
    elif how == "kv_trailing":
        proto.kv_transfer_params_json = '{"a": 1} \x0b'
    elif how == "refs_with_batches":
        proto.media_refs.items.add(modality=1, url="https://x/y.png")
    elif how == "ref_no_url":
        proto.ClearField("mm_inputs")
        proto.ClearField("extra_mm_inputs")
        proto.media_refs.items.add(modality=1, url="")
    elif how == "no_input":
        proto.ClearField("tokenized")
        proto.ClearField("text")
    elif how == "count":
        batch.mm_hashes.extend(["h1", "h2"])
        batch.mm_placeholders.add(offset=0, length=1)


@given(protos(), corruptions)
def test_the_check_refuses_exactly_what_the_core_refuses(
    proto: pb.GenerateRequest, how: str
) -> None:
    corrupt(proto, how)
    try:
        check_generate_request(proto)
    except MalformedRequest as exc:
        assert exc.param  # names the field
        assert not core_verdict(proto)
    else:
        assert core_verdict(proto)


def test_a_media_reference_of_an_unknown_modality_is_refused_without_its_url() -> None:
    # The URL may carry a signature or a tenant's path: the 400 names the field, never it.
    secret = "https://bucket.example/tenant-7/a.png?X-Amz-Signature=s3cr3t"
    proto = pb.GenerateRequest(request_id="r")
    proto.tokenized.input_ids.extend([1, 2, 3])
    proto.media_refs.items.add(modality=99, url=secret)
    try:
        check_generate_request(proto)
    except MalformedRequest as exc:
        assert exc.param == "media_refs.items[0].modality"
        assert "s3cr3t" not in str(exc.to_body()) and "bucket" not in str(exc.to_body())
    else:
        raise AssertionError("an unknown modality was accepted")
