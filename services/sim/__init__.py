"""The simulators: corral's decision functions and fold on a simulated clock, with no NATS
(``driver.py``); the time-dynamic Philly experiment (``philly.py``); the Alibaba placement replay
(``alibaba.py``) against the published policies (``baselines.py``); the traces they read
(``traces/``) and the curves they draw (``plot.py``). ``corral sim`` is in ``services.cli.sim``."""
