-- The quota database lives beside Airflow's metadata database, in the same PostgreSQL server.
-- Run once by the postgres image when its data volume is first created.
CREATE DATABASE quota OWNER airflow;
