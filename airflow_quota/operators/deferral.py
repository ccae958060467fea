"""Whether the quota operators and sensors wait deferred when a DAG does not say: Airflow's
``[operators] default_deferrable`` when the deployment chose it, else deferred.

The amazon provider's operators take ``conf.getboolean("operators", "default_deferrable",
fallback=False)``: not deferred unless the deployment asks. A training waits for quota for
hours, and a task that waits in a worker holds its slot all that time, so the quota's operator
and sensors wait deferred unless the deployment asked otherwise.

Only the environment variable ``AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE`` counts as asking:
Airflow 3.3 writes ``default_deferrable = false`` into every ``airflow.cfg`` it generates
(``write_default_airflow_configuration_if_needed`` writes each default's value), so a
``false`` in the file cannot be told from a file nobody edited; and a ``true`` there is what
the quota's operators do anyway.
"""

from __future__ import annotations

import os

SECTION, KEY = "operators", "default_deferrable"
ENVIRONMENT_VARIABLE = f"AIRFLOW__{SECTION.upper()}__{KEY.upper()}"
"""The setting a deployment makes to choose for every deferrable operator, these included."""


def default_deferrable() -> bool:
    """``[operators] default_deferrable`` when ``AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE`` sets
    it (read through Airflow's configuration, which refuses a value that is not a boolean),
    else True (see the module's docstring for why the file's value does not count)."""
    if ENVIRONMENT_VARIABLE not in os.environ:
        return True
    from airflow.configuration import conf

    return conf.getboolean(SECTION, KEY)
