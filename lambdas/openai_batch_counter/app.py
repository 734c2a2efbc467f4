"""OpenAI batch line counter and finalizer Lambda entry point: SQS events from the
batch-events queue (subscribed to the events topic, terminal job events, raw delivery), with
partial batch responses (ReportBatchItemFailures)."""

from asyncinfer.openai_api.finalize import handler

__all__ = ["handler"]
