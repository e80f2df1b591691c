"""Placing an attempt on a roster: every role's member is one that can serve it, routable
and not excluded, and the only failures are the ones the module names."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from pd_policy import (
    EncoderCacheRole,
    Health,
    HealthState,
    MultimodalNotSupported,
    NoDecodeWorkerAvailable,
    NoWorkerAvailable,
    PolicyError,
    Request,
    Roster,
    RosterMember,
    VisionSupport,
    WorkerCapability,
    media_affinity,
    place,
    rendezvous_order,
    select_decode_workers,
    select_encoder_workers,
    select_prefill_workers,
)
from pd_policy.selection import DecodeCandidate
from pd_policy.tools.scenarios import image_request
from strategies import requests, workers

Member = RosterMember[WorkerCapability]
health = st.sampled_from([Health.HEALTHY, Health.HEALTHY, Health.HEALTHY, Health.EJECTED])
#: Most prefills can process media and most encoders are encoder-only, so that most draws
#: are placed (the failures are each a few percent: see the test's events).
_vision = WorkerCapability(VisionSupport.TRUE)
by_role = {
    "prefill": st.one_of(
        st.just(_vision),
        st.just(attrs.evolve(_vision, encoder_cache=EncoderCacheRole.CONSUMER)),
        workers,
    ),
    "decode": workers,
    "encode": st.one_of(
        st.just(WorkerCapability(VisionSupport.TRUE, encoder_cache=EncoderCacheRole.PRODUCER)),
        workers,
    ),
}


#: A role is missing from one roster in ten (the 503 for none listed), encoders in half.
counts = {
    "prefill": st.sampled_from([0, *[1, 2, 3] * 3]),
    "decode": st.sampled_from([0, *[1, 2, 3] * 3]),
    "encode": st.integers(0, 2),
}
#: An E/P/D roster: encoders listed, most of them encoder-only, and most prefills
#: consumers of their cache.
epd_roles = {
    **by_role,
    "prefill": st.one_of(st.just(attrs.evolve(_vision, encoder_cache=EncoderCacheRole.CONSUMER)),
                         by_role["prefill"]),
    "encode": st.just(attrs.evolve(_vision, encoder_cache=EncoderCacheRole.PRODUCER)),
}  # fmt: skip
epd_counts = {**counts, "encode": st.integers(1, 2)}


@st.composite
def rosters(draw: st.DrawFn, *, epd: bool = False) -> Roster[WorkerCapability]:
    roster: Roster[WorkerCapability] = Roster(clock=lambda: 0.0)
    roles, sizes = (epd_roles, epd_counts) if epd else (by_role, counts)
    for role in ("prefill", "decode", "encode"):
        for i in range(draw(sizes[role])):
            member = Member(role, f"{role}-{i}", draw(roles[role]), HealthState(draw(health)))
            member.outstanding = draw(st.integers(0, 4))
            roster.join(member)
    return roster


def _capability(member: Member) -> WorkerCapability:
    return member.worker


def _compatible(
    roster: Roster[WorkerCapability], role: str, request: Request, *, encoded: bool = False
) -> list[Member]:
    listed = [DecodeCandidate(m.worker, m) for m in roster.of(role)]
    if role == "encode":
        return [c.handle for c in select_encoder_workers(listed)]
    if role == "prefill":
        return [c.handle for c in select_prefill_workers(request, listed, encoded=encoded)]
    try:
        return [c.handle for c in select_decode_workers(request, listed)]
    except PolicyError:
        return []


def _up(members: list[Member], exclude: list[str]) -> list[Member]:
    return [m for m in members if m.health.health is Health.HEALTHY and m.name not in exclude]


@given(rosters() | rosters(epd=True), requests(n=st.just(1)), st.booleans(),
       st.sampled_from([[], [], ["prefill-0"], ["decode-1"], ["encode-0"]]))  # fmt: skip
def test_each_role_gets_a_compatible_routable_member_or_a_named_failure(
    roster: Roster[WorkerCapability], request: Request, encode: bool, exclude: list[str]
) -> None:
    try:
        placed = place(roster, request, capability=_capability, exclude=exclude, encode=encode)
    except MultimodalNotSupported:
        encoded = encode and bool(_up(_compatible(roster, "encode", request), exclude))
        event("refused: no prefill can process the media" + (" after E" if encoded else ""))
        assert roster.of("prefill")
        assert not _compatible(roster, "prefill", request, encoded=encoded)
        return
    except NoWorkerAvailable as exc:
        role = exc.code.removeprefix("no_").removesuffix("_worker_available")
        event(f"503: {role}")
        encoders = _compatible(roster, "encode", request) if encode else []
        prefills = _compatible(roster, "prefill", request, encoded=bool(encoders))
        # Either that role's compatible members are all out, or (for the decode) the
        # core refused it for a reason of its own: never a routable compatible member.
        if role == "encode":
            assert encoders and not _up(encoders, exclude)
        elif role == "prefill":
            # A 503 says "retry": only right when a compatible prefill may come back, or
            # none is listed at all; a fleet that cannot serve the media is a 400.
            assert (prefills or not roster.of("prefill")) and not _up(prefills, exclude)
        else:
            decodes = _compatible(roster, "decode", request)
            assert decodes and not _up(decodes, exclude)
        return
    except NoDecodeWorkerAvailable:
        event("503: no decode listed")
        assert not roster.of("decode")
        return
    except PolicyError as exc:
        event(f"refused by the decode rule: {exc.code}")
        assert roster.of("decode") and not _compatible(roster, "decode", request)
        return
    event("placed" + (" with an encoder" if placed.encoder else ""))
    encoders = _compatible(roster, "encode", request) if encode else []
    assert (placed.encoder is not None) == bool(encoders)
    if placed.encoder is not None:
        assert placed.encoder in _up(encoders, exclude)
    prefills = _compatible(roster, "prefill", request, encoded=placed.encoder is not None)
    assert placed.prefill in _up(prefills, exclude)
    assert placed.decode in _up(_compatible(roster, "decode", request), exclude)
    assert placed.members[-1] is placed.decode


def test_the_prefill_follows_the_media_and_the_decode_the_request_as_decided() -> None:
    vision = WorkerCapability.from_labels({"supports_vision": "true"})
    lm_only = WorkerCapability.from_labels({"supports_vision": "false"})
    roster: Roster[WorkerCapability] = Roster(clock=lambda: 0.0)
    for i in range(4):
        roster.join(Member("prefill", f"p{i}", vision, HealthState(Health.HEALTHY)))
    roster.join(Member("decode", "d-lm", lm_only, HealthState(Health.HEALTHY)))
    roster.join(Member("decode", "d-vision", vision, HealthState(Health.HEALTHY)))
    one = Request(request_id="r", input_ids=[1, 2, 3])
    calls: list[tuple[str, bool]] = []

    def decided(prefill: Member, encoded: bool) -> Request:
        calls.append((prefill.name, encoded))
        return one

    placed = place(roster, one, capability=_capability, decided=decided)
    assert calls == [(placed.prefill.name, False)]
    assert media_affinity(one) is None
    roster.named("d-lm").outstanding = 3  # type: ignore[union-attr]
    assert place(roster, one, capability=_capability).decode.name == "d-vision"


_PRODUCER = WorkerCapability(VisionSupport.TRUE, encoder_cache=EncoderCacheRole.PRODUCER)
_CONSUMER = attrs.evolve(_vision, encoder_cache=EncoderCacheRole.CONSUMER)


def _prefills(loads: list[int]) -> Roster[WorkerCapability]:
    """A roster of vision prefills with ``loads``, and two decodes."""
    roster: Roster[WorkerCapability] = Roster(clock=lambda: 0.0)
    for i, load in enumerate(loads):
        member = roster.join(Member("prefill", f"p{i}", _vision, HealthState(Health.HEALTHY)))
        member.outstanding = load
    for i in range(2):
        roster.join(Member("decode", f"d{i}", _vision, HealthState(Health.HEALTHY)))
    return roster


def test_the_prefill_holding_the_prefix_waits_behind_one_request_not_two() -> None:
    text = Request(request_id="r", input_ids=[1, 2, 3])
    # Four prefills, one busy with one request: the cap is ceil(1.25 * 2 / 4) = 1, which it
    # is past; its prefix is worth the wait behind one request.
    roster = _prefills([0, 0, 1, 0])
    held = {"p2": 4}
    assert place(roster, text, capability=_capability, cached=held).prefill.name == "p2"
    # Behind two (the cap is still ceil(1.25 * 3 / 4) = 1) it is not: the least loaded.
    roster.named("p2").outstanding = 2  # type: ignore[union-attr]
    assert place(roster, text, capability=_capability, cached=held).prefill.name == "p0"


@given(st.integers(2, 5), st.data(), st.booleans())
def test_prefills_holding_a_prefix_alike_take_it_in_turn_whatever_the_other_legs(
    size: int, data: st.DataObject, epd: bool
) -> None:
    names = [f"p{i}" for i in range(size)]
    tied = sorted(data.draw(st.sets(st.sampled_from(names), min_size=2), label="tied"))
    # Alike: as many blocks, as many requests (within the slack); the others hold less.
    held = {name: 4 if name in tied else data.draw(st.integers(0, 3)) for name in names}
    load = data.draw(st.integers(0, 1), label="load")
    roster = _prefills([load if name in tied else 0 for name in names])
    if epd:  # an encoder's leg chosen before each prefill's
        roster.join(Member("encode", "e0", _PRODUCER, HealthState(Health.HEALTHY)))
        for name in names:
            roster.named(name).worker = _CONSUMER  # type: ignore[union-attr]
    event(f"{len(tied)} alike" + (", E/P/D" if epd else ""))
    event("every prefill alike" if len(tied) == size else "beside others")
    text = Request(request_id="r", input_ids=[1, 2, 3])
    chosen = [
        place(roster, text, capability=_capability, encode=epd, cached=held).prefill.name
        for _ in range(2 * len(tied))
    ]
    # Each run of as many placements as there are such prefills takes each of them once.
    for at in range(len(tied) + 1):
        assert sorted(chosen[at : at + len(tied)]) == tied


images = st.lists(st.sampled_from(["a.jpg", "b.jpg", "c.jpg"]), min_size=1, max_size=2)


@given(st.lists(images, min_size=1, max_size=3), st.integers(2, 5), st.integers(2, 3),
       st.booleans(), st.booleans())  # fmt: skip
def test_media_goes_to_its_keys_first_encoder_and_prefill_and_the_key_names_every_batch(
    batches: list[list[str]], prefills: int, encoders: int, epd: bool, exclude_home: bool
) -> None:
    # A batch of each: the ids of three images hold every batch's placeholders.
    parts = [image_request(images=tuple(names)) for names in batches]
    base = image_request(images=("x.jpg",) * 3)
    request = attrs.evolve(base, batches=tuple(b for part in parts for b in part.batches))
    key = media_affinity(request)
    assert key is not None and {h for b in request.batches for h in b.mm_hashes} <= set(
        key.split(",")
    )
    roster: Roster[WorkerCapability] = Roster(clock=lambda: 0.0)
    for role, count, worker in [("prefill", prefills, _CONSUMER if epd else _vision),
                                ("encode", encoders if epd else 0, _PRODUCER),
                                ("decode", 1, _vision)]:  # fmt: skip
        for i in range(count):
            roster.join(Member(role, f"{role}-{i}", worker, HealthState(Health.HEALTHY)))

    def home(role: str, leaving: tuple[str, ...] = ()) -> str:
        names = [m.name for m in roster.of(role) if m.name not in leaving]
        return names[rendezvous_order(key, names)[0]]

    # An earlier attempt failed on the encoder the key's order puts first: the next one.
    exclude = (home("encode"),) if epd and exclude_home else ()
    calls: list[tuple[str, bool]] = []

    def decided(prefill: Member, encoded: bool) -> Request:
        calls.append((prefill.name, encoded))
        return request

    event(f"{len(batches)} batch(es)" + (", E/P/D" if epd else ""))
    if exclude:
        event("the key's first encoder out")
    placed = place(roster, request, capability=_capability, encode=epd, exclude=exclude,
                   decided=decided)  # fmt: skip
    assert placed.prefill.name == home("prefill")
    assert (placed.encoder is not None) == epd
    if placed.encoder is not None:
        assert placed.encoder.name == home("encode", exclude)
    assert calls == [(placed.prefill.name, epd)]  # the decode sees the request as encoded


def test_a_fleet_that_cannot_take_the_media_says_why() -> None:
    request = image_request()
    lm_only = WorkerCapability(VisionSupport.FALSE)
    roster: Roster[WorkerCapability] = Roster(clock=lambda: 0.0)
    roster.join(Member("prefill", "p", lm_only, HealthState(Health.HEALTHY)))
    roster.join(Member("decode", "d", _vision, HealthState(Health.HEALTHY)))
    with pytest.raises(MultimodalNotSupported, match="language model only"):
        place(roster, request, capability=_capability)
    # An encoder took the media: the prefills must load its outputs, which a vision
    # prefill that is no cache consumer does not.
    roster.named("p").worker = _vision  # type: ignore[union-attr]
    roster.join(Member("encode", "e", _PRODUCER, HealthState(Health.HEALTHY)))
    with pytest.raises(MultimodalNotSupported, match="ec_consumer"):
        place(roster, request, capability=_capability, encode=True)
