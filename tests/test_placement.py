"""Placing an attempt on a roster: every role's member is one that can serve it, routable
and not excluded, and the only failures are the ones the module names."""

from __future__ import annotations

import attrs
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
    select_decode_workers,
    select_encoder_workers,
    select_prefill_workers,
)
from pd_policy.selection import DecodeCandidate
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
