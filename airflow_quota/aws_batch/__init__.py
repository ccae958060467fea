"""The same quota policy on AWS Batch itself (issue 42): ``policy`` turns a quota configuration
into the AWS Batch quota-management objects of one job queue and back, and diffs them, with no
I/O; ``commands`` is ``airflow-quota aws-batch plan | apply | import``, which reads and writes
them through ``airflow_quota.hooks.aws_batch.AwsBatchQuotaHook``.
"""
