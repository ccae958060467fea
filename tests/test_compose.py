"""``docker-compose.yml``: Airflow 3.3's official layout (api-server, scheduler, dag-processor,
triggerer, a Celery worker with Redis, PostgreSQL, an init service) with airflow-quota installed,
the quota database beside Airflow's, two quota scheduler replicas, and QuotaExecutor's Celery
delegate with a worker per instance type of the example pool.

``docker compose config`` validates it where the compose plugin is installed; the checks below
run everywhere."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import missing

REPO = Path(__file__).resolve().parents[1]
AIRFLOW_SERVICES = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-worker": "celery worker",
    "airflow-triggerer": "triggerer",
}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert isinstance(document, dict)
    return document


def compose_command() -> list[str] | None:
    """``docker compose`` (the plugin) where installed, else Debian's ``docker-compose``."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_docker_compose_config_accepts_it() -> None:
    command = compose_command()
    if command is None:
        missing("neither the docker compose plugin nor docker-compose is installed (make compose)")
    done = subprocess.run([*command, "config", "--quiet"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_docker_compose_config_refuses_a_broken_file(tmp_path: Path) -> None:
    """The check above can fail: the same command on a file with a bad dependency condition."""
    command = compose_command()
    if command is None:
        missing("neither the docker compose plugin nor docker-compose is installed (make compose)")
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  a:\n    image: busybox\n    depends_on:\n      b:\n        condition: bogus\n")
    done = subprocess.run([*command, "config", "--quiet"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode != 0 and "condition" in done.stdout + done.stderr


def test_it_has_the_official_services_and_the_quota_scheduler(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) >= {*AIRFLOW_SERVICES, "airflow-init", "postgres", "redis", "quota-scheduler"}
    for name, command in AIRFLOW_SERVICES.items():
        assert services[name]["command"] == command, name
        assert services[name]["build"] == "." and "airflow-quota" in services[name]["image"], name
        assert services[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert "healthcheck" in services[name] and services[name]["restart"] == "always", name


def test_celery_with_redis_and_postgres_metadata(compose: dict[str, Any]) -> None:
    env = compose["services"]["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"].split(",") == [
        "CeleryExecutor",
        "quota:airflow_quota.executors.QuotaExecutor",
    ]
    assert (
        env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://")
        and "@redis:6379" in env["AIRFLOW__CELERY__BROKER_URL"]
    )
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].endswith("@postgres/airflow")
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/"
    worker = compose["services"]["airflow-worker"]
    assert worker["environment"]["DUMB_INIT_SETSID"] == "0"
    assert worker["depends_on"]["airflow-apiserver"]["condition"] == "service_healthy"


def test_a_celery_worker_per_instance_type_of_the_pool_takes_the_quota_executors_tasks(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    env = services["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__QUOTA__EXECUTOR_DELEGATE"] == "celery"
    imports = json.loads(env["AIRFLOW__CELERY__EXTRA_CELERY_CONFIG"])["imports"]
    assert imports == ["airflow_quota.executors.celery_worker"]
    pool = yaml.safe_load((REPO / "examples" / "quota.yaml").read_text())["pool"]["capacity"]
    queues = {
        name: service["command"].removeprefix("celery worker --queues ")
        for name, service in services.items()
        if str(service.get("command", "")).startswith("celery worker --queues ")
    }
    assert sorted(queues.values()) == sorted(pool), queues
    for name in queues:
        worker = services[name]
        assert (
            worker["environment"]["AIRFLOW__CELERY__EXTRA_CELERY_CONFIG"] == env["AIRFLOW__CELERY__EXTRA_CELERY_CONFIG"]
        )
        assert worker["environment"]["DUMB_INIT_SETSID"] == "0"
        assert worker["depends_on"]["airflow-apiserver"]["condition"] == "service_healthy"
        assert "healthcheck" in worker and worker["restart"] == "always", name


def test_the_quota_database_is_a_second_database_in_the_same_postgres(compose: dict[str, Any]) -> None:
    services = compose["services"]
    quota_url = services["airflow-scheduler"]["environment"]["AIRFLOW_CONN_QUOTA_DEFAULT"]
    user, host, database = re.fullmatch(r"postgresql://(\w+):\w+@(\w+)/(\w+)", quota_url).groups()  # type: ignore[union-attr]
    assert (host, database) == ("postgres", "quota")
    assert services["postgres"]["environment"]["POSTGRES_USER"] == user
    mount = next(v for v in services["postgres"]["volumes"] if "docker-entrypoint-initdb.d" in v)
    init_dir = REPO / mount.split(":")[0]
    sql = "\n".join(p.read_text() for p in init_dir.glob("*.sql"))
    assert re.search(rf"CREATE DATABASE {database}\b", sql), sql
    # every service that reads quota state sees the same connection
    for name in (*AIRFLOW_SERVICES, "quota-scheduler", "airflow-init"):
        assert services[name]["environment"]["AIRFLOW_CONN_QUOTA_DEFAULT"] == quota_url, name


def test_two_quota_scheduler_replicas_and_an_init_that_prepares_the_quota_database(compose: dict[str, Any]) -> None:
    services = compose["services"]
    quota = services["quota-scheduler"]
    assert quota["deploy"]["replicas"] == 2
    assert "airflow-quota scheduler" in " ".join(quota["command"])
    assert quota["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
    assert any(v.endswith(":/opt/airflow/quota-state") for v in quota["volumes"])  # shared by the replicas
    init = services["airflow-init"]
    script = "\n".join(init["command"])
    assert "airflow-quota db migrate" in script and "airflow-quota apply /opt/airflow/quota/quota.yaml" in script
    assert init["environment"]["_AIRFLOW_DB_MIGRATE"] == "true"
    # the files it mounts exist in the repository
    examples = next(v for v in init["volumes"] if v.endswith(":/opt/airflow/quota"))
    assert (REPO / examples.split(":")[0] / "quota.yaml").is_file()
    for volume in services["airflow-scheduler"]["volumes"]:
        source = volume.split(":")[0]
        if source.startswith("./"):
            assert (REPO / source).exists(), volume
        else:
            assert source in compose["volumes"], volume


def test_the_image_installs_the_package_on_the_pinned_airflow() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^ARG AIRFLOW_VERSION=3\.3\.\d+$", dockerfile, re.M)
    assert "FROM apache/airflow:${AIRFLOW_VERSION}" in dockerfile
    assert re.search(
        r'pip install .*"apache-airflow==\$\{AIRFLOW_VERSION\}" "/opt/airflow-quota\[airflow\]"', dockerfile
    )
    for copied in re.findall(r"^COPY \S+ (.+) \S+$", dockerfile, re.M):
        for path in copied.split():
            assert (REPO / path).exists(), path
