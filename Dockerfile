# The Airflow image with airflow-quota installed: the plugin (Quotas page), the operator, the
# triggers and the `airflow-quota` command. Built by docker-compose.yml (`docker compose build`).
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11
FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}
ARG AIRFLOW_VERSION
COPY --chown=airflow:root pyproject.toml README.md /opt/airflow-quota/
COPY --chown=airflow:root airflow_quota /opt/airflow-quota/airflow_quota
# Pin Airflow to the image's version so installing the package never moves it.
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" "/opt/airflow-quota[airflow]"
