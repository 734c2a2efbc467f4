"""Webhook dispatcher Lambda entry point: SQS events from the webhook queue (subscribed to the
events topic, raw delivery), with partial batch responses (ReportBatchItemFailures)."""

from asyncinfer.webhooks.dispatcher import lambda_handler as handler

__all__ = ["handler"]
