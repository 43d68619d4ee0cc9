"""The in-process discrete-event simulator: corral's decision functions and fold on a simulated
clock, with no NATS (``driver.py``), the time-dynamic Philly experiment (``philly.py``) and the
``corral sim`` verb (``cli.py``)."""
