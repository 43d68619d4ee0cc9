"""The preemptor: frees GPUs for urgent work and for queues reclaiming their nominal quota, and
moves work to make room for a job that waits on scattered GPUs.

``decide.py`` is the pure cycle; ``victims.py`` chooses victims by simulating on a snapshot;
``consolidation.py`` finds the moves; the anti-thrash guards that keep jobs from being preempted
again and again are the fold's (``projections/thrash.py``).
"""
