"""The HTTP conformance vectors and the docs tables, run through the shaping functions
(``python -m pd_policy_vllm.openai.tools.vectors``, ``...tables``, ``...identity_table``)."""
