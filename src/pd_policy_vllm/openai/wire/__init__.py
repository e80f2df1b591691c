"""Bodies as bytes: a client's body read within its limits (``body``), parsed with its data
URLs left in its bytes (``skim``, ``data_url``), a few members of its bytes rewritten
(``splice``), JSON in and out (``codec``) within its bounds (``strict``: its depth, no key
twice), and token ids kept as a worker's bytes (``token_ids``)."""
