"""The forecast role: every waiting job's estimated start, kept current in a bucket the read
service reads, and what-if questions answered for the asking tenant. It drives the simulator
(``services/sim``) on a copy of the folded state, as ``corral sim`` does."""
