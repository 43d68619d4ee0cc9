"""Who sees what, and how a text one tenant reads names what it may not see.

A tenant sees its own jobs and the queues open to it; the admin sees everything
(``sees_job``, ``sees_queue``: the read service's rule). Texts about a job (why it waits, why it
was stopped, its history) are read by its owner, so they are written for its owner: another
job is named by its id only when the same tenant owns it, else as "another tenant's job"; a
queue by its name only when it is open to that tenant, else as "another queue". The admin
finds the other side of each decision in the log's events, which name every job.
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.events import subjects
from corral.events.queues import QueueSpec
from corral.projections.state import JobState

OTHER_JOB = "another tenant's job"
OTHER_QUEUE = "another queue"


def sees_job(asker: str, job: JobState) -> bool:
    return asker in (subjects.ADMIN, job.tenant)


def sees_queue(asker: str, queue: QueueSpec) -> bool:
    return asker == subjects.ADMIN or not queue.tenants or asker in queue.tenants


def job_named(job_id: str, owner: str | None, reader: str) -> str:
    """Job ``job_id`` (of tenant ``owner``; None: not known) as a text for ``reader`` names it."""
    return job_id if owner is not None and owner == reader else OTHER_JOB


def job_of(jobs: Mapping[str, JobState], job_id: str, reader: str) -> str:
    """``job_named`` for a job of the state ``jobs`` (one it no longer holds is another's)."""
    other = jobs.get(job_id)
    return job_named(job_id, None if other is None else other.tenant, reader)


def job_told(jobs: Mapping[str, JobState], job_id: str, reader: str) -> str | None:
    """Job ``job_id`` as a field of an answer to ``reader`` gives it: its id where ``reader`` sees
    that job (the admin every job; a tenant its own, of the state ``jobs``), else None, the
    field left out where a text says "another tenant's job"."""
    other = jobs.get(job_id)
    return job_id if reader == subjects.ADMIN or (other is not None and other.tenant == reader) else None


def queue_named(queues: Mapping[str, QueueSpec], name: str, reader: str) -> str:
    """Queue ``name`` as a text for tenant ``reader`` names it."""
    spec = queues.get(name)
    return name if spec is not None and sees_queue(reader, spec) else OTHER_QUEUE
