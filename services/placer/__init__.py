"""The placer: which GPUs each admitted job gets.

``decide.py`` is the pure decision (one cycle over the admitted jobs) and ``service.py`` its shell.
What fits where is the placement chain in ``projections.placement`` (filters, scores and
reserves, a gang placed whole or not at all), which the preemptor asks too; ``backfill.py`` holds
a reservation for the first job that does not fit and lets others backfill around it.
"""
