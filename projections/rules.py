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
# 5: who may be stopped for whom follows the beneficiary's queue's preemption policy; a lender
#    takes back lent quota counting the record's own-queue victims as gone, and the sides of a
#    cohort tree two queues meet in decide who lent to whom; a priority class may cap a job's
#    preemptions over its whole life; no job is stopped for another once either was stopped
#    for the other. The fold keeps each queue's GPU time held (placement to
#    release), decayed with the half-life the admin sets (``ApplyFairShare``): fair share
#    counts what ran.
#    Admission may withdraw an admitted job's admission (``AdmissionWithdrawn``): back to
#    queued, its quota given back, when no node can host it any more.
#    A job's priority may change after it was accepted (``JobPriorityChanged``).
# 6: a preemption's or a shrink's deadline is log time: the grace its decision grants
#    (``deadline - now``) counted from the record's own log time, not the decider's clock.
#    Finished jobs leave the state a retention period (log time, ``ApplyRetention``) after they
#    end; a job id is free again once its job was let go. A job's ``priority_seq`` starts at its
#    submission's position, so ``stopped_for`` never names a later job of the same id.
#    The fold keeps indexes of the jobs in the State (``projections/indexes.py``): job ids per
#    phase, queued job ids per queue, ids of the jobs holding GPUs per node.
# 7: a job's runtime estimate is fixed at submission, its owner's or else the median running time
#    of the latest similar jobs that succeeded (``projections/runtimes.py``), and every reader
#    of expected ends, holds, backfill and the shortest-first order uses it.
# 8: a preemption or shrink whose beneficiary no longer waits (placed, running or finished by the
#    time the fold reaches it) is void.
# 9: the fold keeps each queue's queued jobs in the order the queue serves them (priority, then
#    submission, then id), and the workers the unfinished jobs ask for per kind of ask: the
#    State holds them (``projections/indexes.py``), so a snapshot of other rules is not read.
# 10: the fold keeps, per beneficiary, the jobs that name it in a phase that nominates it, and
#    per queue, its queued jobs that carry a reason (``projections/indexes.py``).
# 11: a node's agent stopping its workers because it was told to (``NodeShutdown``) interrupts
#    the jobs on the node without counting a restart, as a lost node does; a worker's exit must
#    name a rank placed on the node that reports it.
# 12: the fold keeps, per host shape (``indexes.host_shape``), the queued jobs of that shape
#    (``projections/indexes.py``), so that admission judges the backlog shape by shape.
# 13: a queue's preemption policy may share fairly (``fair_sharing``, Kueue's KEP-1714
#    strategies): the fold lets a beneficiary stop another queue's borrower of any priority when
#    its queue's share, from the decayed GPU time each queue held, stays no worse than the
#    victim's queue's (``projections.preemption.Shares``). The ask and host-shape index keys leave
#    out a field that equals its default (``indexes.ask_key``), however the record spelt it.
# 14: the fold keeps, per form (``indexes.form_key``: a queue and the ask, replicas, topology
#    and selector of its jobs), the places of the queued jobs of that form, in their queue's
#    order (``projections/indexes.py``), so that the preemptor judges the backlog form by form.
# 15: a job's learned runtime estimate is the median of the latest similar jobs that succeeded
#    *submitted* last (``runtimes.LATEST``, kept per class in ``State.latest_runs``), not of
#    those that ended last.
# 16: admission may withdraw an admitted job's admission when the placer found it no room for
#    the placement timeout (``AdmissionWithdrawn.admit_after``): the job then sits out a back-off
#    (``JobState.admit_after``, log time) and the fold voids an admission of it before it ends
#    (``projections.queueing.backs_off``).
# 17: the fold voids a withdrawal whose back-off is not a finite log time at most
#    ``projections.queueing.MAX_BACKOFF_S`` past its record (it would keep the job out for ever).
# 18: a job's learned runtime estimate is kept also when its owner gave one (the short-job lane
#    checks the owner's against it, ``queueing.short``); the fold refuses a fair-share
#    ``short_job_gpu_s`` that is not a number of GPU-seconds, 0 or more.
# 19: the fold keeps, per tenant, how far their estimated jobs ran past the estimate
#    (``State.estimate_record``) and fixes each estimated job's ``overrun`` at its submission: the
#    short-job lane takes an owner's estimate as far as their record bears it out.
# 20: a job that fails or is cancelled after running past its owner's estimate goes on the
#    owner's record too (``runtimes.ended_unwell``).
# 21: a job that may not be preempted (its spec or its class) is admitted only while what its
#    queue's jobs that may not be preempted hold stays within the queue's nominal
#    (``Ledger.may_borrow``; the fold keeps it, ``State.quota_held_fixed``); borrowing over a
#    lower-priority borrower is for a beneficiary that borrows (one within its side's own quota
#    once its victims are gone takes lent quota back only as ``reclaim_within_cohort`` allows);
#    a preemption may not leave another queue it stops jobs of short of its nominal by as much
#    as the least it gives back in one piece (``preemption.below_nominal``).
# 22: an admitted job keeps where its admission stood in admission's order
#    (``JobState.admitted_at``), the order the placer places admitted jobs in.
# 23: a queue's fair share for preemption is its history or what it holds now, whichever is
#    more, with the stops under way counted in full (``preemption.Shares``), read before the
#    record's own victims.
# 24: the least piece an elastic job gives back is one rank only while it runs and is not
#    shrinking already (``preemption.least_given``): one placed or shrinking is stopped whole.
# 25: of the fair shares, only the beneficiary's queue's counts what it holds now where that
#    is more than its history (``Shares.taker``); a victim's queue is judged by its history.
# 26: a preemption may move its victims (``PreemptionRequested.moves``, a consolidation): any
#    queue's preemptible jobs of no higher priority (for a borrower, of its own queue or of
#    queues that borrow too), each on a node the beneficiary goes to, for an admitted
#    beneficiary that waits for room, while no stop or move is under way, where the layout the
#    record names holds with them gone (``moves.may_move``).
# 27: a moved job keeps where its move puts it (``JobState.moved_to``) until it is placed again;
#    the placer holds those GPUs for it meanwhile.
# 28: a cohort tree is read as Kueue reads it (``Ledger.borrows_from``, ``Ledger.within_own``,
#    ``Ledger.borrowing_height``): a cohort holds what its members hold beyond what their lending
#    limits keep for them, against its own quota and what they may lend; a job is another
#    queue's borrower only while its queue and every cohort above it up to its side of the tree
#    hold more than that; a beneficiary takes lent quota back when its queue, or a cohort on
#    its way up to its side, stays within it.
# 29: a checkpoint is folded only from a node its attempt has a worker on (placed, or still
#    holding GPUs), as an exit is.
# 30: a cordon is lifted only by the admin's request: a ``NodeCordoned`` that lifts one (which
#    the health monitor never writes, and a node's agent could) is refused, and one cordoning a
#    node that drains leaves it draining.
# 31: a resize to more workers than a submission may ask for (``events.jobs.MAX_REPLICAS``) is
#    refused.
# 32: a job counts in the workers per ask (``State.workers_by_ask``) with at most
#    ``events.jobs.MAX_REPLICAS`` workers, whatever its submission asked before admission judged it.
# 33: a queue's or cohort's nominal quota and limits are 0 to ``MAX_QUOTA_GPUS`` GPUs, a queue's
#    weight a finite positive number, a fair-share half-life at least a second; else the request
#    is malformed.
# 34: jobs that may not be preempted may hold, besides their queue's nominal, its part by weight
#    of its cohort's own quota where the cohort shares it (``CohortSpec.share_own_quota``,
#    ``Ledger.fixed_limit``).
# 35: a preemption or shrink may name the GPU model its stops are for (``key``), where the
#    beneficiary names several; the fold judges it there and charges the beneficiary there while
#    its stops are under way (``JobState.reclaim_key``).
# 36: a tenant has at most ``RetentionSpec.jobs_per_tenant`` jobs in the state (any phase, the
#    finished ones not let go yet included): a submission past it is refused (``limit``).
# 37: a job's reason names the job it was preempted, moved or shrunk for only when the same
#    tenant owns both, else "another tenant's job" (``projections/visibility.py``); a cancel's
#    reason is kept to ``REASON_CHARS`` characters.
# 38: the admin may delete a node no job holds anything on (``DeleteNode``): it leaves the state.
# 39: a job that names several GPU models is placed only on GPUs of the model its admission
#    counts against (``shape.placed_resources``), where that is one of them.
# 40: a job stopped, moved or shrunk is due by its own grace, not the longest of the record's
#    victims, and a job of another queue than the beneficiary's by at most that queue's
#    ``PreemptionPolicy.max_grace_seconds`` (``preemption.grace_s``); a negative one is malformed.
# 41: a job that asks more than its queue's nominal and would borrow beyond a cohort below the
#    tree's root has nobody stopped for it, its own queue's jobs included, unless its queue may
#    preempt while borrowing (``preemption.may_preempt_for``, Kueue's flavor assigner).
# 42: a tenant's jobs in the state hold at most ``RetentionSpec.spec_bytes_per_tenant`` of specs
#    (``indexes.spec_bytes``): a submission past it is refused (``limit``).
# 43: a job that asks for no GPU (it holds no quota) may be stopped for any queue's job that holds
#    or claims quota (``preemption.rides``).
# 44: ... of its own queue too, whatever ``within_queue`` says.
# 45: a queue that names ``fair_sharing`` strategies may preempt while borrowing whatever its
#    ``reclaim_within_cohort`` (``preemption.may_preempt_for``).
# 46: a node registering more than ``MAX_GPUS_PER_NODE`` GPUs, negative CPU, memory, GPU memory
#    or NVLinks, or an island past that bound is malformed (``fold_nodes``).
# 47: a request whose subject names no tenant (an empty or non-token one) is refused.
# 48: a queue's weight is at least ``MIN_WEIGHT``; a priority class's times and counts are not
#    negative (``fold_requests``).
# 49: an attempt or a rank below 0 is malformed (``events.base.Index``), where it was taken as a
#    straggler of an attempt long over and folded to nothing.
# 50: a node runs at most ``NodeInventory.max_workers`` workers at once (256 unless its agent
#    says, 1..``MAX_WORKERS_PER_NODE``): a placement past it is void (``claims``).
# 51: a held GPU re-registered in the other mode (into or out of MIG) interrupts the jobs that
#    hold it, and takes no new claim until they give it back (``GpuState.held_in_other_mode``).
# 52: a drain asks the jobs on the node to checkpoint, gives each its own grace, then stops
#    them (``fold_nodes.drain_jobs``), where it interrupted them at once.
# 53: a priority class may not turn non-preemptible while its jobs hold more than jobs that may
#    not be preempted may (``fold_requests._fixed_past_limit``): the loan would be permanent.
# 54: a queue may not close to a tenant with jobs waiting in it, nor leave its cohort while it
#    borrows there (``fold_requests._may_change``).
# 55: a held GPU re-registered as another model interrupts the jobs that hold it, as one in the
#    other mode does (51).
# 56: a drain names no beneficiary and gives at most the queue's ``max_grace_seconds``
#    (``preemption.drain_grace_s``); a queue may not close to a tenant with any unfinished job in
#    it, nor leave a cohort tree where some queue borrows.
# 57: a MIG slice given back on a GPU re-registered as a model without its profile frees what it
#    took: the slices taken are what the instances left hold (``claims._release_mig``). A cohort
#    may not move to another parent while its tree borrows, and may be deleted (``DeleteCohort``)
#    once nothing is in it and its quota is not lent (``fold_requests._none_borrows``). A job
#    whose workers have all exited keeps its GPUs while ranks of its placement are still to start
#    (``fold_nodes._release_if_over``). ``AdmissionWithdrawn`` of a running elastic job withdraws
#    its growth whose added ranks are placed nowhere (admitted again at the workers it has), and
#    a growth during its back-off (``JobState.grow_after``) is void. A MIG instance keeps the
#    memory slices and share it took (``MigInstance.mask``, ``milli``) and gives back those. A
#    failed GPU stays failed when its node registers again, held or not. A failure or a lost
#    node that hits only ranks a shrink took away leaves the job running (``interrupt_on``).
#    A queue's quota may not be cut below what its jobs that may not be preempted hold.
# 58: no admin change of a queue or cohort may leave jobs that may not be preempted holding past
#    their queue's limit (``fold_requests._fixed_cut``): a sibling's weight raised, a queue
#    joining, or a cohort's own quota cut or no longer shared, where it shares its own quota.
# 59: a class's ``max_preemptions`` does not protect a job that asks for no GPU
#    (``thrash.capped``): it may always be stopped for GPU work in the end.
# 60: a ``GpuHealthChanged`` whose ``uuid`` is not that of the GPU at its index (the node
#    registered again, renumbered) is void (``fold_nodes._gpu_health``).
# 61: a job that ends stops naming the job it was stopped for, and the jobs stopped for it stop
#    naming it (``fold_moves._ended``), where they named it until it was let go; a job's
#    ``victims`` are those that still name it.
# 62: a worker's start, exit or checkpoint naming a ``run`` other than its job's submission is
#    of an earlier job of the id, and unknown (``fold_nodes._no_job``).
# 63: a drain, or a registration renumbering GPUs, that reaches only ranks a shrink took away
#    leaves the job running (``fold_nodes.drain_jobs``, ``_gpus_moved``), as a failure does (57).
# 64: an admin's uncordon with ``repaired`` marks every GPU of the node healthy again.
# 65: a failed exit naming an XID that says one of the rank's GPUs is at fault
#    (``WorkerExited.xids``, ``projections.xids.hardware``) fails that GPU and interrupts the jobs
#    on it, the exiting one without counting a restart (``fold_nodes._faulted``).
# 66: a ``GpuHealthChanged`` naming a ``uuid`` and an index past the node's GPUs is void, not
#    unknown: the node registered again with fewer (the monitor then says it again).
# 67: a checkpoint of an attempt over that holds nothing is a straggler and changes nothing,
#    where it was refused (``fold_nodes._checkpointed``).
# 68: a failed exit naming a GPU fault fails the GPU whatever the job's phase (checkpointing, or
#    a rank a shrink took away), as the monitor's verdict would (65 only while it ran), and for
#    a rank of an attempt already over that still holds its GPUs (a gang's second rank).
# 70: of the rejections kept, one tenant's requests have at most ``MAX_REJECTIONS_PER_TENANT``
#    (``fold._reject``; ``State.rejections_lost``): a tenant's flood no longer erases others'.
# 71: ... its subjects the fold cannot read as requests (``corral.in.T.a.b``) count as its own.
# 72: the State counts each tenant's kept rejections (``State.rejections_kept``).
# 73: a fair-sharing victim's queue counts its history or what it holds now, whichever is less
#    (``Shares.share``): by its history alone, one that held much for days was taken below an
#    even split.
# 74: learned runtimes are bounded per tenant too (``runtimes.MAX_CLASSES_PER_TENANT``, its own
#    oldest let go first) and a name or command longer than ``runtimes.MAX_NAME`` is keyed by its
#    digest: one tenant's unique jobs let go of every other tenant's history.
# 75: a node's registration with more than ``MAX_LABELS`` labels, a label longer than
#    ``MAX_LABEL_BYTES`` or with control characters, or a GPU model or UUID longer than
#    ``MAX_GPU_NAME`` (or no model) is malformed (``fold_nodes._registered``).
# 76: a job is admitted as one that may not borrow (``JobState.fixed``, counted in
#    ``State.quota_held_fixed`` while it holds quota) when it may not be preempted, and now also
#    when it has been preempted as often as its class's cap allows, unless it is larger than
#    what such jobs of its queue may hold (``Ledger.may_borrow``); a class may not lower its cap
#    to what its borrowing jobs have had.
# 77: the rule for a preemption charges a queued beneficiary that may not borrow, and gives back
#    a checkpointing job that held so, as fixed parts of the queue's nominal
#    (``preemption.hold``, ``preemption.release``): one the other did not count let another such
#    job be proposed into the part of the nominal a stop was for.
# 78: a deleted queue's GPU time goes with it (``State.gpu_time``).
# 79: a submit whose queue or priority class is not a name, or whose MIG profile or a GPU model
#    is longer than ``fold_requests.MAX_MIG`` or ``MAX_GPU_NAME``, is malformed.
# 80: a stop for a queued beneficiary that may not borrow is refused while its queue's jobs that
#    may not be preempted hold too much of what they may for it to be admitted after
#    (``preemption.may_stop``): it stopped work in vain.
# 81: ``State.rejections_lost`` keeps at most ``MAX_REJECTIONS_LOST`` tenants, the oldest
#    position past it kept for all (``State.rejections_lost_floor``).
# 82: the admin's ``DeletePriorityClass`` forgets a class no unfinished job names.
# 83: a submit naming more than ``MAX_GPU_MODELS`` GPU models is malformed too.
# 84: the State keeps the positions of each tenant's kept rejections, oldest first, not their
#    count (72): its oldest is found without a walk of all kept.
# 85: the owner's resize gives leaving ranks at most their queue's ``max_grace_seconds`` and
#    keeps a shrink under way's beneficiary and deadline; the preemptor's shrink is a time in
#    ``JobState.preempted_at`` (the cooldown and hourly guards count it).
# 86: the owner's resize during an owner's earlier shrink (no beneficiary) gives the ranks leaving
#    now their capped grace, not the earlier shrink's deadline (perhaps past).
# 87: an owner's shrink is capped by the least ``max_grace_seconds`` of its cohort tree's
#    queues (``preemption.shrink_grace_s``); a class's ``max_preemptions_per_hour`` above
#    ``MAX_PREEMPTION_TIMES`` is malformed.
# 88: a checkpoint whose location no worker could resume from (empty, longer than a path, a
#    control character) is malformed.
# 89: a node's shutdown reason is kept as a tenant's (``said_reason``) in the reasons of the jobs
#    it interrupts.
# 90: a queue's lending limit above its nominal is malformed (as Kueue's); a queue that cannot be
#    deleted names the unfinished jobs that keep it in its refusal.
# 91: an exit whose agent says the node kept the worker from starting (``node_fault``) sends the
#    job back to its queue without counting a restart, up to ``NODE_FAULTS_FREE`` times a job
#    (then it is the job's failure, which counts for no node), and the node keeps the jobs whose
#    starts it so failed in a row (``NodeState.start_faults``, emptied by any other exit there or
#    the lifting of its cordon); a cordon keeps its reason (``NodeState.cordon_reason``); a
#    worker that never started for its job's own fault says why in the job's reason
#    (``start_error``).
# 92: a queued job's form (``indexes.form_key``) holds whether it may be preempted at all (its
#    ``preemptible`` and priority class), so that one that may not borrow does not stand for the
#    jobs behind it that may.
# 93: a job a consolidation stops to run elsewhere keeps that it was moved for the other
#    (``JobState.moved_for``), not only that it was stopped for it.
# 94: a job stopped by a preemption (not a move) for one it was moved for before, that move
#    since dropped from ``stopped_for``, keeps no move for it (``JobState.moved_for``).
# 95: a change of the fair-share half-life scales each queue's decayed GPU time by new / old
#    (``gpu_time.apply_settings``), so that what a queue held lately reads the same across it.
# 96: the fold's own words count as people do: "1 worker", "1 GPU" (a shrink's reason, the
#    refusals of a resize and of a quota cut, which no longer name the any-model key ``*``), and a
#    resize of a job that is not elastic says so.
# 97: the fold keeps, per queue, the jobs in a phase that holds quota
#    (``State.holding_quota_by_queue``, ``projections/indexes.py``), so that admission and the
#    preemptor read a queue's holders when a cycle asks about that queue, not every job running.
# 98: a node whose agent shut it down saying it registers the node again when back
#    (``NodeShutdown.registers_again``) takes no new work until it does (``NodeState.shut_down``),
#    which a placement there is refused for.
# 99: the fold keeps, per phase, its elastic jobs (``State.elastic_by_phase``,
#    ``projections/indexes.py``), so that growth and shrinking read the running elastic jobs,
#    not every job running.
# 100: a queue below its nominal is said to have what it may take now in its cohort, its own
#    unused nominal first, with how much of it is borrowed or of its nominal in use by other
#    queues (``Ledger.standing``), not "the cohort has N to lend" counting its own nominal in N.
# 101: a job a planned shutdown of its node (``NodeShutdown.registers_again``) interrupted while
#    placed or running keeps where it ran (``JobState.kept_place``) until it is placed again, its
#    admission is withdrawn or it ends, so that admission and the placer give it its place back
#    before anyone else (``queueing.keeps_place``).
# 102: a job keeps the log time its current attempt entered its queue (``JobState.attempt_since``),
#    so that a trace taken up from a snapshot times the attempt as one that folded the log does.
# 103: a registration that renumbers a node's GPUs moves the places kept across its shutdown
#    (``JobState.kept_place``) with them, by UUID, as it moves claims: held by the old indexes,
#    the place fell on other GPUs (a worker one of whose GPUs left keeps none there).
# 104: a job a planned shutdown of its node stops has its own reason code,
#    ``fold_nodes.SHUT_DOWN``, where it had a fault's ("interrupted"): traces told the two apart
#    by the reason's words.
# 105: the reason of a job the placer's reservation keeps off the free GPUs names, as data, the
#    job they are reserved for (``Reason.reserved_for``), which the state keeps with the reason;
#    the placer writes the reason again when only that job changed.
# 106: the fold keeps the jobs a place is held for (``State.places_held``: ``JobState.kept_place``
#    or ``moved_to`` given, ``projections/indexes.py``), so that the placer, the preemptor and a
#    registration that renumbers GPUs read those, not every job waiting; a job that ends keeps no
#    place a move named (``moved_to``), as it kept none a shutdown left it.
# 107: a moved job whose admission is withdrawn (placed nowhere for the timeout, or no node
#    can host it) keeps no place its move named (``moved_to``), as it keeps none a shutdown
#    left it: admitted again, the GPUs were held for it once more, idle behind the same wait.
# 108: a submit of its owner's job id with another spec than the job's (but for a resize's
#    most workers) is refused as a conflict, not recorded as a duplicate of that job.
# 109: the fold keeps each tenant's job ids in submission order (``State.jobs_by_tenant``, its
#    count before), so that a tenant's list of its jobs reads its own, not every tenant's.
# 110: an elastic job resized keeps the most workers it was submitted with
#    (``JobState.sent_replicas``): a submit of its id with another count is a conflict, where
#    any count was taken for a duplicate of it.
# 111: log time never goes back: a record stamped before the newest log time folded (a stream
#    leader's clock stepped back) is folded at the log's time so far, so that no fact it states
#    (a preemption's deadline, a phase's start) lies in the log's past.
# 112: fair sharing between queues of different cohorts compares the shares of the two sides of
#    the tree below the cohort they meet in (Kueue's almost lowest common ancestors): a cohort's
#    from its queues' GPU time less its nominal, over its queues' weight on average
#    (``Shares.may_take_from``), where it compared the two queues' own shares.
RULES = 112
