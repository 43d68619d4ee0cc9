"""The admission service: the only door to the GPUs.

``decide`` (pure) validates submitted jobs, requeues stopped ones, keeps every queue in
fair-share order and admits whole gangs within quota; ``order`` is the fair-share order,
``validate`` the request checks, ``grow`` the growth of running elastic jobs, ``service`` the
shell. Quota arithmetic lives in ``projections.quota`` because the fold uses it too, to arbitrate
the admissions ``decide`` proposes; what a waiting job holds, in ``projections.holds``, because
the preemptor keeps the same holds.
"""
