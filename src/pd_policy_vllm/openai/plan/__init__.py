"""One request's legs, decided by the policy: the request as it sees it (``request``), the
plan and its steps around the calls to the workers (``steps``), and the bodies of the
legs: prefill and decode (``legs``), the metadata path's render, generate and derender
(``scale_out``), a prefill leg sent from a render the router holds (``render_once``),
E/P/D's encode leg (``encode``), and the Responses API (``responses``)."""
