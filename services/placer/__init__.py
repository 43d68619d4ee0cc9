"""The placer: which GPUs each admitted job gets.

``decide.py`` is the pure decision (one cycle over the admitted jobs); ``stack.py`` assembles the
plugin chain (``framework.py``, ``plugins/``); ``gang.py`` places a job's whole gang or nothing
on a cycle's ``snapshot.py``; ``backfill.py`` holds a reservation for the first job that does not
fit. ``alibaba.py`` replays the Alibaba GPU trace through the same fit and packing code, against
the published policies (``baselines.py``), and ``plot.py`` draws its curves.
"""
