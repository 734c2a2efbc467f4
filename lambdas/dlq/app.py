"""DLQ handler: SQS events from the models' dead-letter queues (ReportBatchItemFailures)."""

from asyncinfer.functions.dlq import handler

__all__ = ["handler"]
