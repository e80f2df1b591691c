"""One request's legs, decided by the policy: the request as it sees it (``request``), the
plan and its steps around the calls to the workers (``steps``), and the bodies of the
legs: prefill and decode (``legs``), the metadata path's render, generate and derender
(``scale_out``), E/P/D's encode leg (``encode``), and the Responses API (``responses``)."""
