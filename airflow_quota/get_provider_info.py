"""airflow-quota as an Airflow provider: what Airflow's ``ProvidersManager`` lists for it.

Registered by the ``apache_airflow_provider`` entry point in ``pyproject.toml``, in the shape
of the amazon provider's ``get_provider_info`` (Airflow's runtime ``provider_info.schema.json``),
so ``airflow providers list``, ``airflow providers hooks``, ``… links`` and ``… notifications``
show the package, and the connection form offers an "Airflow Quota" connection type. Plain
data, importing nothing: Airflow reads it at start-up.

A provider that ships an executor declares its ``cli`` functions (Airflow 3.3's
``ProvidersManager.cli_command_functions``): without the section, every ``airflow`` command
imports the executor to ask it for commands and first logs a warning, "Please define the 'cli'
section ...", on standard output, ahead of ``-o json`` output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.cli.cli_config import CLICommand

PACKAGE = "airflow_quota"


def get_cli_commands() -> list[CLICommand]:
    """The commands the provider adds to ``airflow``: none. ``QuotaExecutor`` needs none of its
    own (its tasks' placements come from the quota scheduler), and the quota administration is
    the ``airflow-quota`` command. Declared as the provider's ``cli`` section so that Airflow
    does not fall back to importing the executor at every command, with a warning."""
    return []


def get_provider_info() -> dict[str, Any]:
    """The provider's description for Airflow: its integration, the modules of its operators,
    sensors, triggers and hooks, the connection type of the quota database (``QuotaHook``'s
    ``conn_type``), the extra link, the notifiers, and the ``[quota]`` options: declaring
    ``sql_alchemy_conn`` sensitive is what lets Airflow read it from ``sql_alchemy_conn_cmd``
    and ``sql_alchemy_conn_secret`` (``store/settings.py``)."""
    integration = "Airflow Quota"
    return {
        "package-name": "airflow-quota",
        "name": "Airflow Quota",
        "description": (
            "Quota shares, borrowing, preemption and preference lists for GPU training from Apache Airflow "
            "(AWS Batch quota management for SageMaker, inside Airflow)."
        ),
        "integrations": [{"integration-name": integration, "tags": ["software"]}],
        "operators": [{"integration-name": integration, "python-modules": [f"{PACKAGE}.operators.training"]}],
        "sensors": [{"integration-name": integration, "python-modules": [f"{PACKAGE}.sensors.quota"]}],
        "triggers": [{"integration-name": integration, "python-modules": [f"{PACKAGE}.triggers.quota"]}],
        "hooks": [
            {
                "integration-name": integration,
                "python-modules": [f"{PACKAGE}.hooks.quota", f"{PACKAGE}.hooks.aws_batch"],
            }
        ],
        "connection-types": [
            {
                "hook-class-name": f"{PACKAGE}.hooks.quota.QuotaHook",
                "hook-name": "Airflow Quota",
                "connection-type": "quota",
                "ui-field-behaviour": {
                    "hidden-fields": [],
                    "relabeling": {"schema": "Database"},
                    "placeholders": {
                        "host": "the quota database's PostgreSQL host",
                        "schema": "quota",
                        "port": "5432",
                        "extra": '{"sql_alchemy_conn": "sqlite:////var/lib/airflow/quota.db"}',
                    },
                },
            }
        ],
        "extra-links": [
            f"{PACKAGE}.plugins.links.QuotaJobLink",
            f"{PACKAGE}.plugins.links.SageMakerTrainingJobLink",
            f"{PACKAGE}.plugins.links.TrainingLogsLink",
        ],
        "notifications": [f"{PACKAGE}.notifications.log.QuotaLogNotifier"],
        "executors": [f"{PACKAGE}.executors.QuotaExecutor"],
        "cli": [f"{PACKAGE}.get_provider_info.get_cli_commands"],
        "config": {
            "quota": {
                "description": "Settings of airflow-quota (quota shares for GPU training).",
                "options": {
                    "sql_alchemy_conn": {
                        "description": (
                            "The quota database's SQLAlchemy URL, where the Airflow connection quota_default "
                            "does not exist. Sensitive (it may hold a password): it may be given as "
                            "sql_alchemy_conn_cmd or sql_alchemy_conn_secret.\n"
                        ),
                        "version_added": "0.1.0",
                        "type": "string",
                        "sensitive": True,
                        "example": "postgresql://quota:secret@db:5432/quota",
                        "default": None,
                    },
                    "quota_conn_id": {
                        "description": "The Airflow connection through which QuotaExecutor uses the quota database.\n",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "quota_prod",
                        "default": "quota_default",
                    },
                    "executor_delegate": {
                        "description": (
                            "Where QuotaExecutor runs a task once the quota scheduler places it: local (its "
                            "own worker processes, as LocalExecutor) or celery (the Celery queue named after "
                            "the placed instance type, through the celery provider and the [celery] settings; "
                            "each GPU host runs airflow celery worker -q <instance type>, and the workers load "
                            "airflow_quota.executors.celery_worker through [celery] extra_celery_config, which "
                            "gives each task its placement and a preempted task its SIGTERM).\n"
                        ),
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "celery",
                        "default": "local",
                    },
                },
            }
        },
    }
