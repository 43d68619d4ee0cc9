"""The node agent: discovers its node's GPUs, runs the workers the fold placed on it, reports what
they do, and checkpoints them on request. ``decide`` is its pure core, ``service`` its shell,
``workers`` runs and watches the worker processes (plain, in bubblewrap via ``sandbox``, or in a
container via ``container``), ``discovery`` reads the hardware through NVML, and ``inventory``
holds the simulated nodes' profiles."""
