"""A request's life through a router, as h11 writes HTTP: events in, actions out.

The [`Exchange`][pd_policy.exchange.machine.Exchange] ([`machine`][pd_policy.exchange.machine])
holds one request's state: it asks for a plan on the members the fleet's rules place it
on, for each leg in order, checks the KV handoff before any decode leg, blames the member
a failed leg went to, tries again while the client has seen nothing and the budget
allows, and finishes with a status. Its events and actions are
[`events`][pd_policy.exchange.events]; its phases and the one table of their transitions,
[`states`][pd_policy.exchange.states]. Every router here (the HTTP proxy, the gRPC routers,
Ray's decode server) is a short I/O loop around it.

May import: the seed's policy and [`pd_policy.fleet`][pd_policy.fleet] (placement, the
roster's members); never ``cache`` or ``media``.
"""

from __future__ import annotations

from .machine import ONE_PAIR, Exchange, IoAction, Placer, fixed, one_pair, settle

__all__ = ["ONE_PAIR", "Exchange", "IoAction", "Placer", "fixed", "one_pair", "settle"]
