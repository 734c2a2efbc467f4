"""DLQ handler Lambda entry point: SQS events from the models' dead-letter queues, with partial
batch responses (ReportBatchItemFailures)."""

from asyncinfer.dlq import lambda_handler as handler

__all__ = ["handler"]
