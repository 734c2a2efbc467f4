"""OpenAI batch expander Lambda entry point: SQS events from the batch queue (expand, end,
check), with partial batch responses (ReportBatchItemFailures)."""

from asyncinfer.openai_api.expansion import handler

__all__ = ["handler"]
