"""What a log means is versioned: the golden log, a committed file, folds to a committed state.

If this fails, the fold now makes something else of a log than it did: a change of the rules.
When that is the point, bump ``projections.rules.RULES`` and run ``python -m tests.golden_log``
in the same commit; otherwise the change rewrote history, and must not.
"""

from __future__ import annotations

import msgspec

from corral.projections.fold import fold
from corral.projections.rules import RULES
from corral.services.cli import logfile
from tests.golden_log import HASH, LOG, state_hash

# The rules the golden files were written under.
GOLDEN_RULES = 112


def test_the_golden_log_folds_to_the_golden_state() -> None:
    state = fold(logfile.read(LOG))
    assert state.faults == 0
    assert state_hash(state) == HASH.read_text().strip(), (
        "the fold's rules changed: bump RULES and rerun python -m tests.golden_log, on purpose only"
    )


def test_the_golden_files_are_of_these_rules() -> None:
    assert RULES == GOLDEN_RULES, "new rules: rerun python -m tests.golden_log and set GOLDEN_RULES"


def test_the_golden_log_speaks_of_every_phase_it_can_reach() -> None:
    """It stays a rich log: jobs in waiting, running, final and refused states, a lost node."""
    state = fold(logfile.read(LOG))
    phases = {j.phase for j in state.jobs.values()}
    assert {"running", "interrupted", "cancelled", "rejected"} <= phases
    assert {r.code for r in state.rejections} >= {"unknown", "malformed", "void"}
    assert {n.condition for n in state.nodes.values()} == {"ready", "lost"}


def test_a_record_of_a_newer_schema_is_refused_not_guessed_at() -> None:
    from corral.events import codec, subjects
    from corral.events.codec import SCHEMA_VERSION, DecodeError
    from corral.events.jobs import JobAccepted
    from corral.events.log import Record

    env = codec.seal(JobAccepted(job_id="j1", priority=0), event_id="e", time=1.0, producer="p")
    newer = codec.encode(msgspec.structs.replace(env, v=SCHEMA_VERSION + 1))
    try:
        codec.decode_envelope(newer)
        raise AssertionError("decoded a newer schema")
    except DecodeError as e:
        assert e.code == "unknown" and f"v{SCHEMA_VERSION + 1}" in str(e)
    state = fold([Record(1, subjects.job("j1"), newer, None, 1.0)])
    assert [(r.code, state.faults) for r in state.rejections] == [("unknown", 0)]


async def test_services_record_the_rules_they_decide_under() -> None:
    from corral.events import codec
    from corral.events.jobs import JobAccepted
    from corral.events.log import InMemoryLog
    from corral.services.runtime.shell import Service

    log = InMemoryLog()
    svc = Service("admission", lambda state, now: [JobAccepted(job_id="j1", priority=0)], log)
    await svc.restore()
    await svc.cycle()
    (record,) = log.records
    assert codec.decode_envelope(record.data).rules == RULES
