"""The version of the fold's rules: what a log means.

The log is the truth only together with the rules that fold it. ``RULES`` names this build's:
it is bumped by any change after which the same log folds to a different state (a new check on
a proposal, a different arbitration, a derived field computed otherwise), and only then. A test
folds a golden log, committed as a file, and compares the state's hash with a committed one, so
no such change goes unnoticed (``tests/unit/test_golden_log.py``): changing the fold means
bumping ``RULES`` and the golden hash in the same commit.

Every event a service seals carries the rules it was decided under (``Envelope.rules``), and
snapshots are keyed by them, so ``corral replay --verify`` can tell a divergence the code makes
by design (a log written under other rules) from one it should not, and a service never resumes
from a snapshot another version of the rules folded.
"""

from __future__ import annotations

# 2: a node's registration holds GPUs by UUID: holds follow a renumbered GPU, and the jobs on a
#    GPU that moved or left are interrupted.
# 3: the fold stops a job for another only by the preemptor's own rule (projections.preemption):
#    another queue's job only while that queue borrows, never one its class's guards protect.
# 4: a rejection of a batch decision says which of its items were void, and why, as data.
# 5: a job's priority may change after it was accepted (``JobPriorityChanged``), and the
#    preemption rule reads the priority it has then.
RULES = 5
