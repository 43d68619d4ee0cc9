"""The intake: the one door from clients into the log. ``decide`` (pure) says what a request
becomes, an append as its tenant's or a refusal; ``service`` takes requests on core NATS,
appends and answers."""
