"""E/P/D in the core: the encoder-cache role, the encoder's answer, the legs and the workers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd_policy import (
    EC_ROLE_LABEL,
    DecodeCandidate,
    EncoderCacheRole,
    MalformedRequest,
    MissingEncoderOutput,
    PolicyError,
    PrefillForm,
    Request,
    Support,
    WorkerCapability,
    encode_leg,
    encoder_consumer_leg,
    encoder_outputs,
    ensure_encoder_outputs,
    needs_encode_leg,
    select_encoder_workers,
    select_prefill_workers,
    worker_from_json,
    worker_to_json,
)
from pd_policy.tools.scenarios import image_request, mrope_request, text_request
from strategies import requests

PRODUCER = WorkerCapability(Support.TRUE, encoder_cache=EncoderCacheRole.PRODUCER)
CONSUMER = WorkerCapability(Support.TRUE, encoder_cache=EncoderCacheRole.CONSUMER)
PLAIN = WorkerCapability(Support.TRUE, encoder_cache=EncoderCacheRole.NONE)
LM_ONLY = WorkerCapability(Support.FALSE)


def answer(request: Request, *, metadata: bool, skip: str | None = None) -> str:
    """The ec_transfer_params an encoder returns for ``request`` (without ``skip``)."""
    entries = {}
    for b in request.batches:
        for i, h in enumerate(b.mm_hashes):
            if h != skip:
                meta = {"image_grid_thw": [[1, 2, 2]]} if metadata else {}
                entries[h] = {"item_indices": [i], "metadata": meta}
    return json.dumps(entries)


@pytest.mark.parametrize(
    ("role", "connector", "expected"),
    [
        ("ec_producer", "ECExampleConnector", EncoderCacheRole.PRODUCER),
        ("ec_consumer", "ECExampleConnector", EncoderCacheRole.CONSUMER),
        ("ec_both", "ECExampleConnector", EncoderCacheRole.CONSUMER),  # not encoder-only
        ("ec_producer", None, EncoderCacheRole.NONE),  # vLLM: a role counts with a connector
        (None, None, EncoderCacheRole.NONE),
    ],
)
def test_the_role_is_read_as_vllm_reads_it(
    role: str | None, connector: str | None, expected: EncoderCacheRole
) -> None:
    assert EncoderCacheRole.from_vllm(role, connector) is expected


def test_an_unknown_vllm_role_is_a_typed_error() -> None:
    with pytest.raises(MalformedRequest) as caught:
        EncoderCacheRole.from_vllm("producer", "ECExampleConnector")
    assert caught.value.param == "ec_role"


@pytest.mark.parametrize("value", ["producer", "consumer", "none", "Producer", "ec_producer", ""])
def test_the_label_takes_exact_values_and_round_trips(value: str) -> None:
    worker = WorkerCapability.from_labels({EC_ROLE_LABEL: value})
    expected = EncoderCacheRole.from_label(value)
    assert worker.encoder_cache is expected
    assert (expected is EncoderCacheRole.UNKNOWN) == (value not in {"producer", "consumer", "none"})
    assert WorkerCapability.from_labels(worker.to_labels()) == worker
    assert worker_from_json(worker_to_json(worker)) == worker


def test_the_worker_codec_refuses_an_unknown_role() -> None:
    with pytest.raises(MalformedRequest) as caught:
        worker_from_json({"ec_role": "encoder"})
    assert caught.value.param == "ec_role"


@pytest.mark.parametrize("params", ["[]", '{"h": 1}', '{"h": {"metadata": []}}', "{", '{"": {}}'])
def test_a_malformed_encoder_answer_is_no_answer(params: str) -> None:
    with pytest.raises(MissingEncoderOutput) as caught:
        encoder_outputs(params)
    assert (caught.value.status, caught.value.retryable) == (502, False)


def test_no_answer_reads_as_no_outputs() -> None:
    assert encoder_outputs(None) == {} == encoder_outputs("{}")


def test_an_item_the_encoder_did_not_answer_for_is_a_502_naming_its_position() -> None:
    request = mrope_request()
    (missing,) = request.batches[0].mm_hashes[:1]
    outputs = encoder_outputs(answer(request, metadata=True, skip=missing))
    with pytest.raises(MissingEncoderOutput) as caught:
        encoder_consumer_leg(request, outputs)
    assert caught.value.param == "batches[0].mm_hashes[0]"
    assert missing not in str(caught.value) + json.dumps(caught.value.to_body())


def test_a_qwen_prefill_carries_no_pixels_and_a_llava_prefill_the_image() -> None:
    qwen = mrope_request()
    built = encoder_consumer_leg(qwen, encoder_outputs(answer(qwen, metadata=True)))
    assert built.form is PrefillForm.METADATA
    assert all(b.pixel_values is None for b in built.leg.batches)
    assert [b.placeholders for b in built.leg.batches] == [b.placeholders for b in qwen.batches]
    assert [t.name for t in built.leg.batches[0].tensors] == ["image_grid_thw"]
    llava = image_request()
    built = encoder_consumer_leg(llava, encoder_outputs(answer(llava, metadata=False)))
    assert built.form is PrefillForm.IMAGE
    assert built.leg == llava


def test_text_takes_no_encode_leg_and_the_encode_leg_drops_the_handoff() -> None:
    assert not needs_encode_leg(text_request())
    request = image_request().derive(kv_transfer_params={"a": 1}, n=1)
    leg = encode_leg(request)
    assert leg.kv_transfer_params is None and leg.batches == request.batches


hashed = requests(mm=True, n=st.just(1)).filter(lambda r: all(b.mm_hashes for b in r.batches))


@given(hashed, st.booleans(), st.data())
def test_the_prefill_leg_is_built_only_when_every_item_has_an_output(
    request: Request, metadata: bool, data: st.DataObject
) -> None:
    items = [h for b in request.batches for h in b.mm_hashes]
    skip = data.draw(st.none() | st.sampled_from(items))
    outputs = encoder_outputs(answer(request, metadata=metadata, skip=skip))
    try:
        built = encoder_consumer_leg(request, outputs)
    except MissingEncoderOutput:
        assert skip is not None
        return
    except MalformedRequest as exc:  # metadata form: one placeholder range per item
        assert metadata and exc.param is not None and exc.param.endswith(".placeholders")
        return
    assert skip is None
    ensure_encoder_outputs(built.leg, outputs)  # the leg's identities are the encoder's
    assert list(json.loads(built.ec_transfer_params)) == list(dict.fromkeys(items))
    assert built.form is (PrefillForm.METADATA if metadata else PrefillForm.IMAGE)
    if metadata:
        assert all(b.pixel_values is None for b in built.leg.batches)
        assert [b.mm_hashes for b in built.leg.batches] == [b.mm_hashes for b in request.batches]
    else:
        assert built.leg == request


def candidates(*workers: WorkerCapability) -> list[DecodeCandidate[int]]:
    return [DecodeCandidate(w, i) for i, w in enumerate(workers)]


def test_only_an_encoder_that_says_so_is_picked() -> None:
    pool = candidates(PLAIN, WorkerCapability(), PRODUCER, CONSUMER)
    assert [c.handle for c in select_encoder_workers(pool)] == [2]
    assert select_encoder_workers(candidates(PLAIN, CONSUMER)) == []


def test_a_prefill_that_cannot_serve_is_never_picked_while_one_that_can_is_listed() -> None:
    pool = candidates(PRODUCER, LM_ONLY, PLAIN, CONSUMER)
    image = image_request()
    assert [c.handle for c in select_prefill_workers(image, pool, encoded=True)] == [3]
    assert [c.handle for c in select_prefill_workers(image, pool, encoded=False)] == [2, 3]
    assert [c.handle for c in select_prefill_workers(text_request(), pool, encoded=False)] == [
        1, 2, 3,
    ]  # fmt: skip
    assert select_prefill_workers(image, candidates(PRODUCER, LM_ONLY), encoded=False) == []


def test_every_epd_error_is_catalogued() -> None:
    from pd_policy import ERROR_CATALOG

    entry = ERROR_CATALOG[MissingEncoderOutput.code]
    assert (entry.status, entry.retryable, entry.error) == (502, False, MissingEncoderOutput)
    assert issubclass(MissingEncoderOutput, PolicyError)


def test_the_pixels_stay_unless_every_item_published_metadata() -> None:
    request = image_request(images=("a.jpg", "b.jpg"))
    first, second = request.batches[0].mm_hashes
    mixed = {first: {"item_indices": [0], "metadata": {"image_grid_thw": [[1, 2, 2]]}},
             second: {"item_indices": [1], "metadata": {}}}  # fmt: skip
    built = encoder_consumer_leg(request, encoder_outputs(json.dumps(mixed)))
    assert built.form is PrefillForm.IMAGE  # one item without metadata needs its pixels
    assert built.leg == request
