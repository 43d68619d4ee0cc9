"""``corral dashboard``: a live web page of the cluster over the read service (``app.py``), and
the board it draws, built from the read service's answers (``board.py``)."""
