"""The read service: what a tenant may see, answered from the folded log. ``decide`` is the pure
``answer`` (with ``explain``, ``queues`` and ``present`` for what it shows), ``service`` its
shell; ``identities`` holds the logins and their NATS permissions, ``client`` the asking side."""
