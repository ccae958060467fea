"""The quota state in SQL: SQLAlchemy 2 models, alembic migrations, the repository, leader locks.

Its own database, not Airflow's: SQLite by default (``quota.db`` under ``AIRFLOW_HOME``),
PostgreSQL in production.
"""
