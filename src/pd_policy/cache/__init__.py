"""The prefix cache as a router sees it: vLLM's block hashes of a request, and which worker
holds which blocks.

[`kv_blocks`][pd_policy.cache.kv_blocks] computes vLLM's chain of block hashes (its media
identifiers, its salt and LoRA included) for a request's tokens;
[`prefix_index`][pd_policy.cache.prefix_index] keeps each worker's blocks from its KV events,
in any interleaving, and says how many leading blocks of a request each synced worker
holds. Both are hints for placement: a wrong one costs a cache miss, never an answer.

May import: the seed's policy only (its errors), never another sub-package.
"""
