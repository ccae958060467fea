"""The rules of the scheduling cycle, with no memo and no state of their own: what a placing
step does with one job (``assess``), the orders the steps walk in, and the verdicts.

A new rule goes here (docs/contributing.md, "Adding a rule"); the index (``core/index/``)
decides only which jobs a step looks at, and the full-scan index proves it misses none.
"""

from airflow_quota.core.rules.assess import as_its_share_places, assess
from airflow_quota.core.rules.orders import borrowing_order, queue_order, share_order
from airflow_quota.core.rules.verdicts import (
    CAPACITY_BLOCKS,
    PLACED_BECAUSE,
    SOURCE_BLOCKS,
    Admit,
    Candidate,
    Preempt,
    Step,
    Verdict,
    Wait,
)

__all__ = [
    "CAPACITY_BLOCKS",
    "PLACED_BECAUSE",
    "SOURCE_BLOCKS",
    "Admit",
    "Candidate",
    "Preempt",
    "Step",
    "Verdict",
    "Wait",
    "as_its_share_places",
    "assess",
    "borrowing_order",
    "queue_order",
    "share_order",
]
