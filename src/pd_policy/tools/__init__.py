"""What explains and checks the policy, beside the core that a gateway vendors.

- [`outcome`][pd_policy.tools.outcome]: the whole plan of one request, as data;
- [`scenarios`][pd_policy.tools.scenarios]: the requests of the demo, the docs and the tests;
- [`vectors`][pd_policy.tools.vectors]: the conformance vectors other implementations run;
- [`tables`][pd_policy.tools.tables]: the docs tables, generated from the code;
- [`cli`][pd_policy.tools.cli]: the ``pd-policy`` command (``python -m pd_policy.tools``).

The core never imports this package: vendoring the policy alone means dropping
this folder. It imports the core by its installed name, ``pd_policy``.
"""
