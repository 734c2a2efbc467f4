"""The generation engine of ``causal-lm`` models: continuous batching of any transformers
causal LM, with the scheduler (:mod:`.scheduler`) kept apart from the model runner
(:mod:`.runner`) in the manner of vLLM v1 (requests typed, with a status enum: :mod:`.request`),
per-request sampling on the model's device (:mod:`.sampling`), the tokenizer side
(:mod:`.text`) and the loop over the worker's work source (:mod:`.serving`).

Why not transformers' own continuous batching (``generate_batch`` / ``init_continuous_batching``,
transformers 5.x)? Its sampling is batch-wide (one ``do_sample`` and one generator: no mix of
greedy and sampled jobs, no per-job ``seed``); it runs its own thread and result queue, while the
worker needs the loop in its own thread to check each job for cancel, timeout and shutdown at
every step and finish each job the moment it is done; its paged-attention kernels target
accelerators (on the CPU slower than SDPA over a dense cache, and a greedy job's tokens are no
longer those of ``generate`` alone); and it has no stop strings or token budget.

Importing this package imports torch and transformers (the API Lambda never does)."""

from asyncinfer.models.engine.request import Request, RequestStatus
from asyncinfer.models.engine.runner import BatchedDecoder, RunnerOutput
from asyncinfer.models.engine.sampling import NUCLEUS_CANDIDATES, sample, sample_batch
from asyncinfer.models.engine.scheduler import Scheduler, SchedulerOutput
from asyncinfer.models.engine.serving import GenerationEngine
from asyncinfer.models.engine.text import TextCodec

__all__ = [
    "NUCLEUS_CANDIDATES",
    "BatchedDecoder",
    "GenerationEngine",
    "Request",
    "RequestStatus",
    "RunnerOutput",
    "Scheduler",
    "SchedulerOutput",
    "TextCodec",
    "sample",
    "sample_batch",
]
