"""Remote media, fetched by the proxy itself: once per item, within the worker's rules and the
proxy's own limits (``fetch``), over a session that connects to public addresses only
(``guard``, ``address``)."""
