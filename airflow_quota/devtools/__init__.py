"""Tools to run the product locally: a real Airflow with the quota scheduler, and the demo."""
