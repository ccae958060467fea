"""The install page's deploy files (``deploy/``, docs/install.md) are valid where they go.

- The Kubernetes manifests, against the Kubernetes schemas of a recent version
  (``kubernetes-validate``, strict: an unknown field is refused too), and a broken copy is
  refused, so the check can fail; the objects refer to each other by the right names.
- The systemd unit, with ``systemd-analyze verify``, which also checks that the programs of
  ``ExecStart``/``ExecStartPre`` exist: it verifies a copy whose ``/opt/airflow/venv/bin/``
  paths point at this test's virtualenv instead (the unit's only change); a copy pointing at a
  missing program is refused.
- The Helm values fragment: valid YAML whose keys the official chart has, with the executor
  and connection the page documents.

``docker-compose.yml`` is checked by ``tests/test_compose.py``.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.conftest import ROOT, missing

KUBERNETES = ROOT / "deploy" / "kubernetes"
SYSTEMD = ROOT / "deploy" / "systemd"
KUBERNETES_VERSION = "1.33.0"
"""A recent Kubernetes whose schemas kubernetes-validate ships."""
VALUES = KUBERNETES / "values-airflow-quota.yaml"
MANIFESTS = sorted(p for p in KUBERNETES.glob("*.yaml") if p != VALUES)
UNIT = SYSTEMD / "airflow-quota-scheduler.service"
UNIT_VENV = "/opt/airflow/venv/bin/"
QUOTA_EXECUTOR = "quota:airflow_quota.executors.QuotaExecutor"
CHART_TOP_LEVEL_KEYS = frozenset(
    {"images", "executor", "config", "secret", "env", "extraEnv", "extraEnvFrom", "extraSecrets", "fernetKeySecretName"}
)
"""Top-level keys of the official chart's values.yaml (chart/values.yaml of apache/airflow) the
fragment may use."""


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def objects() -> dict[tuple[str, str], dict[str, Any]]:
    """Every Kubernetes object of the manifests, by kind and name."""
    return {(d["kind"], d["metadata"]["name"]): d for path in MANIFESTS for d in documents(path)}


# -- Kubernetes --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_the_manifests_are_valid_kubernetes_objects(path: Path) -> None:
    docs = documents(path)
    assert docs, path
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_broken_manifest_is_refused() -> None:
    deployment = copy.deepcopy(objects()[("Deployment", "airflow-quota-scheduler")])
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError, match="two"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    unknown = copy.deepcopy(objects()[("Deployment", "airflow-quota-scheduler")])
    unknown["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenessProbes"):
        kubernetes_validate.validate(unknown, KUBERNETES_VERSION, strict=True)


def test_the_deployment_runs_two_quota_schedulers_with_the_secret_and_the_image() -> None:
    found = objects()
    assert set(found) == {
        ("ServiceAccount", "airflow-quota-scheduler"),
        ("Deployment", "airflow-quota-scheduler"),
        ("Secret", "airflow-quota-db"),
    }
    deployment = found[("Deployment", "airflow-quota-scheduler")]
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    assert pod["serviceAccountName"] == "airflow-quota-scheduler"
    (container,) = pod["containers"]
    assert "airflow-quota scheduler" in " ".join(container["args"])
    assert container["resources"]["requests"] and container["resources"]["limits"]
    (init,) = pod["initContainers"]
    assert "airflow-quota db migrate" in " ".join(init["args"])
    secret = found[("Secret", "airflow-quota-db")]
    for env in (container["env"], init["env"]):
        connection = next(e for e in env if e["name"] == "AIRFLOW_CONN_QUOTA_DEFAULT")
        reference = connection["valueFrom"]["secretKeyRef"]
        assert reference["name"] == secret["metadata"]["name"] and reference["key"] in secret["stringData"]
    values = yaml.safe_load(VALUES.read_text())
    image = f"{values['images']['airflow']['repository']}:{values['images']['airflow']['tag']}"
    assert container["image"] == init["image"] == image  # the chart's Airflow image, the same package


# -- the Helm values fragment ------------------------------------------------------------------


def test_the_helm_values_use_the_charts_keys_for_the_image_executor_and_connection() -> None:
    values = yaml.safe_load(VALUES.read_text())
    assert isinstance(values, dict) and set(values) <= CHART_TOP_LEVEL_KEYS, set(values) - CHART_TOP_LEVEL_KEYS
    assert set(values["images"]["airflow"]) <= {"repository", "tag", "digest", "pullPolicy"}
    assert values["executor"] in ("LocalExecutor", "CeleryExecutor", "KubernetesExecutor")
    executors = values["config"]["core"]["executor"].split(",")
    assert executors == [values["executor"], QUOTA_EXECUTOR]
    assert values["config"]["quota"]["executor_delegate"] == (
        "celery" if values["executor"] == "CeleryExecutor" else "local"
    )
    secret = objects()[("Secret", "airflow-quota-db")]
    assert values["secret"] == [
        {"envName": "AIRFLOW_CONN_QUOTA_DEFAULT", "secretName": secret["metadata"]["name"], "secretKey": "connection"}
    ]
    for item in values.get("env", []):
        assert set(item) == {"name", "value"} and isinstance(item["value"], str), item


def test_the_image_tag_is_the_packages_version() -> None:
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    assert yaml.safe_load(VALUES.read_text())["images"]["airflow"]["tag"] == version[1]


# -- systemd -----------------------------------------------------------------------------------


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        missing("systemd-analyze is not installed (Debian's systemd package: make systemd)")
    return subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)


def unit_copy(tmp_path: Path, bin_dir: str) -> Path:
    """The unit with its virtualenv's programs taken from ``bin_dir``: its one change."""
    text = UNIT.read_text()
    assert text.count(UNIT_VENV) == 2, "ExecStartPre and ExecStart run the venv's airflow-quota"
    path = tmp_path / UNIT.name
    path.write_text(text.replace(UNIT_VENV, bin_dir.rstrip("/") + "/"))
    return path


def test_systemd_accepts_the_unit_pointed_at_this_virtualenv(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "airflow-quota").exists()
    done = verify(unit_copy(tmp_path, str(bin_dir)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "airflow-quota-scheduler.service" not in done.stderr, done.stderr  # no warning about it either


def test_systemd_refuses_a_unit_whose_program_is_missing(tmp_path: Path) -> None:
    done = verify(unit_copy(tmp_path, str(tmp_path / "no-venv" / "bin")))
    assert done.returncode != 0
    assert "no-venv/bin/airflow-quota" in done.stderr and "not executable" in done.stderr, done.stderr


def test_the_env_file_example_is_key_value_lines_with_the_quota_connection() -> None:
    lines = [line for line in (SYSTEMD / "airflow-quota.env.example").read_text().splitlines() if line.strip()]
    settings = [line for line in lines if not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Z][A-Z0-9_]*=\S+", line) for line in settings), settings
    names = {line.split("=", 1)[0] for line in settings}
    assert {"AIRFLOW_CONN_QUOTA_DEFAULT", "AIRFLOW_HOME"} <= names
    assert "EnvironmentFile=/etc/airflow/airflow-quota.env" in UNIT.read_text()
