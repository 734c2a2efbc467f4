"""The worker: what the container runs on ECS (``asyncinfer worker --model ID``)."""
