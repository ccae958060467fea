"""The same quota policy on AWS Batch itself (issue 42).

- ``policy``: a quota configuration as the AWS Batch quota-management objects of one job queue
  and back, and their diff; no I/O. ``commands`` is ``airflow-quota aws-batch plan | apply |
  import``, through ``airflow_quota.hooks.aws_batch.AwsBatchQuotaHook``.
- ``calls``: the Batch calls and their retries, for the hook and for the quota scheduler.
- When AWS Batch places (``airflow-quota scheduler --aws-batch-job-queue``, run by
  ``airflow_quota.service.delegation``): ``service_jobs`` (a job as ``SubmitServiceJob``, AWS's
  service jobs read back as the quota scheduler's decisions), ``live_jobs`` (the live jobs a
  leader keeps between rounds, the rows a look writes) and ``starvation`` (rule 8 over what the
  mirror sees); all pure.
"""
