"""The node agent: discovers its node's GPUs, runs the workers the fold placed on it, reports what
they do, and checkpoints them on request. ``decide`` is its pure core, ``runtime`` runs processes,
``discovery`` reads the hardware, and ``health`` is the health monitor's pure policy."""
