"""What fits where: the placement chain that the placer uses to place and the preemptor to
simulate. ``snapshot`` is a cycle's view of the nodes, ``framework`` the chain's points (filter,
score, reserve), ``plugins/`` one small module each, ``stack`` assembles them, and ``gang``
places a job's whole gang or nothing."""
