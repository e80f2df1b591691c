"""Media in a chat body: which parts are media and where their bytes are (``parts``), what
identifies each item (``identity``), and a client's uuids scoped to its tenant
(``tenant``)."""
