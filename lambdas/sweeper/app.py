"""Sweeper: expiry, lease takeover (EventBridge, every minute)."""

from asyncinfer.functions.sweeper import handler

__all__ = ["handler"]
