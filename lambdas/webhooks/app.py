"""Webhook dispatcher: SQS events from the webhook queue (ReportBatchItemFailures)."""

from asyncinfer.functions.webhook_dispatcher import handler

__all__ = ["handler"]
