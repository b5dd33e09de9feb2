"""The building blocks of memory maintenance (seed 004), usable by any rule or layer.

- authority: grants issued by humans, read afresh at every check; writer ranks;
- activities: provenance records, immutable once ended; operations done at most once;
- governance: protected control state (trust policy, schema) behind explicit grants;
- sleep tasks: background work claimed by expected version;
- schedules: rhythms folded from the log (every N-M hours, daily at a local time, after N
  events) that survive restarts;
- watches: delta and silence watches over the change cursor, each fired once;
- elements: every memory record with its strength, salience, stage and lineage; bounded decay
  sweeps; the retention ladder; evidence correction; stale flags;
- beliefs: assertions with room for disagreement; non-destructive identity merge.

The maintenance cycle that uses them is the `maintenance` layer (pulse_adapters.maintenance).
"""

from pulse_core._activities import (
    Activity,
    ActivityBody,
    ActivityEnd,
    Performed,
    activity_draft,
    activity_key,
    end_activity,
    perform_once,
    read_activity,
    register_activity_class,
    retry_once,
)
from pulse_core._authority import (
    AGENT,
    BACKGROUND,
    HUMAN,
    PERMISSIONS,
    Authority,
    Grant,
    authority_key,
    outranks,
    rank,
)
from pulse_core._beliefs import (
    Assertion,
    AssertionClosed,
    AssertionMade,
    BeliefBoard,
    Beliefs,
    IdentityBeliefs,
    classify,
    contested,
)
from pulse_core._element_kinds import (
    CommitmentMade,
    CommitmentUpdated,
    Consolidated,
    Correction,
    InsightRecorded,
    Metabolized,
    Reinforced,
    SalienceSet,
    StageChange,
    Stale,
    element_id,
    split_element_id,
)
from pulse_core._element_queries import dependents, of_identity, references_of
from pulse_core._elements import Commitment, Element, ElementsReader, ElementsState, MemoryElements
from pulse_core._governance import (
    ActiveSchema,
    Governance,
    TrustPolicy,
    activate_schema,
    read_governance,
    set_trust_policy,
)
from pulse_core._merge import (
    IdentityAbsorbed,
    IdentityMerged,
    MergeLink,
    Merges,
    aliases,
    canonical,
    merge_identity,
    read_merges,
    suspect_same,
)
from pulse_core._metabolism import (
    DecayPolicy,
    SweepReport,
    decayed_strength,
    reinforce,
    set_salience,
    sweep,
)
from pulse_core._retention import RetentionLadder
from pulse_core._schedules import (
    AfterEvents,
    DailyAt,
    Every,
    LastFire,
    Schedule,
    ScheduleFired,
    Schedules,
    SchedulesState,
    fire_schedule,
    is_due,
    ms_until_due,
    next_due,
    schedule_key,
)
from pulse_core._sleep import (
    SleepBoard,
    SleepTask,
    SleepTaskCreated,
    SleepTasks,
    claimable,
    sleep_key,
    sleep_task_counts,
)
from pulse_core._watches import (
    Evaluation,
    Fire,
    Watch,
    WatchArmed,
    WatchCondition,
    WatchDecided,
    Watches,
    WatchFired,
    arm_watch,
    armed,
    decide_watch,
    disarm_watch,
    evaluate_watches,
    past_due,
    read_watch,
    watch_key,
)

__all__ = [
    "AGENT", "BACKGROUND", "HUMAN", "PERMISSIONS",
    "ActiveSchema", "Activity", "ActivityBody", "ActivityEnd", "AfterEvents", "Assertion",
    "AssertionClosed", "AssertionMade", "Authority", "BeliefBoard", "Beliefs", "Commitment",
    "CommitmentMade", "CommitmentUpdated", "Consolidated", "Correction", "DailyAt",
    "DecayPolicy", "Element", "ElementsReader", "ElementsState", "Evaluation", "Every", "Fire",
    "Governance", "Grant", "IdentityAbsorbed", "IdentityBeliefs", "IdentityMerged",
    "InsightRecorded", "LastFire", "MemoryElements", "MergeLink", "Merges", "Metabolized",
    "Performed", "Reinforced", "RetentionLadder", "SalienceSet", "Schedule", "ScheduleFired",
    "Schedules", "SchedulesState", "SleepBoard", "SleepTask", "SleepTaskCreated", "SleepTasks",
    "StageChange", "Stale", "SweepReport", "TrustPolicy", "Watch", "WatchArmed",
    "WatchCondition", "WatchDecided", "WatchFired", "Watches",
    "activate_schema", "activity_draft", "activity_key", "aliases", "arm_watch", "armed",
    "authority_key", "canonical", "claimable", "classify", "contested", "decayed_strength",
    "decide_watch", "dependents", "disarm_watch", "element_id", "end_activity",
    "evaluate_watches", "fire_schedule", "is_due", "merge_identity", "ms_until_due",
    "next_due", "of_identity", "outranks", "past_due", "perform_once", "rank",
    "read_activity", "read_governance", "read_merges", "read_watch", "references_of",
    "register_activity_class", "reinforce", "retry_once", "schedule_key", "set_salience",
    "set_trust_policy", "sleep_key", "sleep_task_counts", "split_element_id", "suspect_same",
    "sweep", "watch_key",
]
