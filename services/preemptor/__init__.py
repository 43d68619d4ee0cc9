"""The preemptor: frees GPUs for urgent work and for queues reclaiming their nominal quota.

``decide.py`` is the pure cycle; ``victims.py`` chooses victims by simulating on a snapshot;
``thrash.py`` keeps jobs from being preempted again and again.
"""
