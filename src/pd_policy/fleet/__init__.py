"""The fleet's rules: which workers a request may go to, and how a router keeps count of them.

A roster of members per role ([`roster`][pd_policy.fleet.roster]), each with its health
([`health`][pd_policy.fleet.health]: ejected, draining, readmitted) and its load; the choice
among compatible, healthy members ([`balance`][pd_policy.fleet.balance]: a prefix holder
first, then media affinity bounded by load, then load); one attempt's members
([`placement`][pd_policy.fleet.placement]); when each member is probed or described
again ([`probing`][pd_policy.fleet.probing]); and whether a router is ready for traffic
([`readiness`][pd_policy.fleet.readiness]). Every rule is a pure function of snapshots: a
router does the I/O and reports what happened.

May import: the seed's policy (the top of ``pd_policy``), never another sub-package.
"""
