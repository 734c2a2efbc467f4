"""``Custom::EcsCapacityRelease``: release the GPU Auto Scaling group on stack deletion."""

from asyncinfer.functions.ecs_teardown import handler

__all__ = ["handler"]
