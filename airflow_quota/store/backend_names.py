"""Which backends a job may name: the real ones, and the fake one only where a test asks for it.

Production registers and accepts ``local``, ``sagemaker`` and ``airflow`` (the jobs of
``QuotaExecutor``'s tasks; operators name only the first two). The deterministic ``fake`` backend
(tests, the soak, benchmarks) is enabled by an explicit setting, the environment variable
``AIRFLOW_QUOTA_TEST_BACKENDS=fake``, read by the store (which submissions it accepts) and by
``airflow-quota scheduler`` (which backends it registers) alike.
"""

from __future__ import annotations

import os

from airflow_quota.exceptions import InvalidInput

REAL_BACKENDS = ("local", "sagemaker")
EXECUTOR_BACKEND = "airflow"
"""Jobs of Airflow tasks that ``QuotaExecutor`` runs (``service/backends/executor.py``): accepted
by the store, never named by an operator."""
TEST_BACKENDS = ("fake",)
TEST_BACKENDS_VARIABLE = "AIRFLOW_QUOTA_TEST_BACKENDS"


def enabled_backends() -> tuple[str, ...]:
    """The real backends, then the test backends the environment enables."""
    listed = [name.strip() for name in os.environ.get(TEST_BACKENDS_VARIABLE, "").split(",") if name.strip()]
    unknown = sorted(set(listed) - set(TEST_BACKENDS))
    if unknown:
        raise InvalidInput.single(
            TEST_BACKENDS_VARIABLE, f"{', '.join(unknown)}: only {', '.join(TEST_BACKENDS)} can be enabled for tests"
        )
    return (*REAL_BACKENDS, EXECUTOR_BACKEND, *(name for name in TEST_BACKENDS if name in listed))


def not_enabled(backend: str) -> str:
    """Why a job naming ``backend`` is refused, naming the field and the rule."""
    hint = ""
    if backend in TEST_BACKENDS:
        hint = f" (the {backend} backend is for tests: {TEST_BACKENDS_VARIABLE}={backend})"
    return f"backend: {backend!r} is not one of {', '.join(enabled_backends())}{hint}"
