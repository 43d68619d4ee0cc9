"""The assignments service: folds the log once and keeps every node's view of it (its node's
assignments) in the ``corral_assignments`` bucket, so that node agents need not fold the log.

``decide`` (pure) says which nodes a record concerns and computes their views with
``projections.assignments.node_view``; ``service`` is the shell that folds, holds the role's
lease and writes the keys whose view changed.
"""
