"""A roster chooses by the core's rules with its own settings: its bound and balance, the
members' health, load and cached blocks, the count of each role's choices (the turns of
round robin and of the cache's ties), and draws that spread over the fleet."""

from __future__ import annotations

from collections import Counter

from hypothesis import event, given
from hypothesis import strategies as st

from pd_policy import (
    Balance,
    Health,
    HealthState,
    NoWorkerAvailable,
    Roster,
    RosterMember,
    WorkerSnapshot,
    choose,
)

Member = RosterMember[None]
health = st.sampled_from([Health.HEALTHY, Health.HEALTHY, Health.HEALTHY, Health.EJECTED])


@st.composite
def members(draw: st.DrawFn, role: str) -> list[Member]:
    listed = []
    for i in range(draw(st.integers(1, 5))):
        member = Member(role, f"{role[0]}{i}", None, HealthState(draw(health)))
        member.outstanding = draw(st.integers(0, 4))
        listed.append(member)
    return listed


@given(members("prefill"), members("decode"),
       st.sampled_from([1.0, 1.25, 2.0, 8.0]),
       st.sampled_from([Balance.LEAST_OUTSTANDING, Balance.ROUND_ROBIN]),
       st.none() | st.sampled_from(["img-a", "img-b"]),
       st.dictionaries(st.sampled_from([f"p{i}" for i in range(5)]), st.integers(0, 4)),
       st.sampled_from([(), ("p0",), ("p1", "d0")]),
       st.lists(st.sampled_from(["prefill", "decode"]), min_size=1, max_size=8))  # fmt: skip
def test_a_roster_chooses_by_the_rules_with_its_bound_balance_and_each_roles_turns(
    prefills: list[Member],
    decodes: list[Member],
    bound: float,
    balance: Balance,
    affinity: str | None,
    cached: dict[str, int],
    exclude: tuple[str, ...],
    roles: list[str],
) -> None:
    roster: Roster[None] = Roster(clock=lambda: 0.0, bound=bound, balance=balance)
    for member in (*prefills, *decodes):
        roster.join(member)
    turns = Counter[str]()
    for role in roles:
        listed = prefills if role == "prefill" else decodes
        snapshots = [
            WorkerSnapshot(
                m.name,
                m,
                m.health.health is Health.HEALTHY and m.name not in exclude,
                m.outstanding,
                cached.get(m.name, 0),
            )
            for m in listed
        ]
        try:
            expected = choose(snapshots, role=role, affinity=affinity, bound=bound,
                              balance=balance, turn=turns[role]).handle  # fmt: skip
        except NoWorkerAvailable as exc:  # the roster raises what the rules raise
            event(f"refused: {type(exc).__name__}")
            expected = None
        try:
            chosen = roster.choose(role, listed, affinity=affinity, exclude=exclude, cached=cached)
        except NoWorkerAvailable as exc:
            assert expected is None, exc
        else:
            assert chosen is expected
        turns[role] += 1
    event("both roles interleaved" if len(set(roles)) == 2 else "one role")


def test_two_choices_draw_over_the_whole_fleet() -> None:
    # The roster's draws are its own (a counter mixed by two constants): on an idle fleet,
    # where the first drawn is taken, they reach every member about as often.
    for size in range(2, 9):
        roster: Roster[None] = Roster(clock=lambda: 0.0, balance=Balance.TWO_CHOICES)
        listed = [
            roster.join(Member("prefill", f"p{i}", None, HealthState(Health.HEALTHY)))
            for i in range(size)
        ]
        taken = Counter(roster.choose("prefill", listed).name for _ in range(8 * size))
        assert len(taken) == size and min(taken.values()) >= 4, taken
