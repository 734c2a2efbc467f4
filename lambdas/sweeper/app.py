"""Expiry sweeper Lambda entry point (EventBridge schedule, every minute)."""

from asyncinfer.sweeper import lambda_handler as handler

__all__ = ["handler"]
