"""Replay verification: every decision of a log re-run on the state it was based on
(``verify``; ``corral replay --verify``), and what it found, in an operator's words and as data
(``report``)."""
