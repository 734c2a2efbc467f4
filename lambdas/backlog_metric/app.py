"""Backlog-per-task metrics for ECS scaling (EventBridge, every minute)."""

from asyncinfer.functions.backlog_metric import handler

__all__ = ["handler"]
