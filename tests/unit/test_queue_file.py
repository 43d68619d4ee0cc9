"""What ``corral queue apply`` reads: a queue file's preemption policy, and the refusals of a
file that says something the queue types do not know."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.events.queues import PreemptionPolicy
from corral.services.cli.jobfile import BadInput, convert, load_document
from corral.services.cli.queues import QueueFile, durations_in


def _load(tmp_path: Path, text: str) -> QueueFile:
    path = tmp_path / "queues.toml"
    path.write_text(text)
    return convert(load_document(path), QueueFile, str(path))


def test_a_queue_file_sets_each_preemption_field(tmp_path: Path) -> None:
    doc = _load(
        tmp_path,
        """
[[queues]]
name = "team-a"
quotas = { "*" = { nominal = 8 } }

[queues.preemption]
within_queue = "lower-or-newer-equal-priority"
reclaim_within_cohort = "lower-priority"
borrow_within_cohort = "never"
borrow_priority_threshold = 5
fair_sharing = ["less-than-or-equal-to-final-share", "less-than-initial-share"]

[[queues]]
name = "team-b"
""",
    )
    a, b = doc.queues
    both = ("less-than-or-equal-to-final-share", "less-than-initial-share")
    assert a.preemption == PreemptionPolicy(
        "lower-or-newer-equal-priority", "lower-priority", "never", 5, both
    )
    assert b.preemption == PreemptionPolicy()  # the documented defaults
    assert (b.preemption.within_queue, b.preemption.reclaim_within_cohort) == ("lower-priority", "any")
    assert b.preemption.borrow_within_cohort == "lower-priority" and b.preemption.fair_sharing == ()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('preemption = { reclaim = "any" }', "reclaim"),
        ('preemption = { within_queue = "sometimes" }', "within_queue"),
        ('preemption = { borrow_within_cohort = "any" }', "borrow_within_cohort"),
        ('preemption = { fair_sharing = ["dominant-resource"] }', "fair_sharing"),
        ('preemption = { fair_sharing = "less-than-initial-share" }', "fair_sharing"),
        ("priority = 3", "priority"),
        ('strategy = "random"', "strategy"),
    ],
)
def test_a_queue_file_with_what_corral_does_not_know_is_refused(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(BadInput, match=says):
        _load(tmp_path, f'[[queues]]\nname = "team-a"\n{text}\n')


def test_a_queue_file_writes_its_durations_as_people_do(tmp_path: Path) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text("fair_share: {half_life_s: 7d}\nretention: {finished_s: 1h30m}\n")
    doc = convert(durations_in(load_document(path), str(path)), QueueFile, str(path))
    assert doc.fair_share is not None and doc.fair_share.half_life_s == 7 * 86400
    assert doc.retention is not None and doc.retention.finished_s == 5400


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[fair_share]\nhalf_life_s = -60", "fair_share.half_life_s"),
        ("[fair_share]\nhalf_life_s = nan", "fair_share.half_life_s"),
        ("[fair_share]\nhalf_life_s = 0", "more than 0"),
        ('[retention]\nfinished_s = "soon"', "retention.finished_s: 'soon' is not a duration"),
        ("[retention]\nfinished_s = inf", "retention.finished_s"),
    ],
)
def test_a_queue_file_duration_that_is_none_is_refused_in_one_line(
    tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "queues.toml"
    path.write_text(text + "\n")
    with pytest.raises(BadInput, match=says) as told:
        durations_in(load_document(path), str(path))
    assert "\n" not in str(told.value) and str(told.value).startswith(str(path))
