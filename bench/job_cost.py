"""Cost per 1k generated tokens against batch size (issue 13 item 6): figures, not a test.

Runs the same SmolLM2 jobs through the handler's continuous-batching ``serve`` loop (the engine
offline, no AWS) at several batch sizes, and prints, per batch size, the wall time, the jobs'
``compute_seconds`` summed (what the worker records on each job), generated tokens, and the cost
per 1k generated tokens at the catalogue entry's ``price_per_hour`` (``cost_usd`` summed over the
jobs / tokens x 1000).

Usage: ``PYTHONPATH=src python -m bench.job_cost [--jobs 16] [--tokens 24] [--batches 1,4,16]``
"""

from __future__ import annotations

import argparse
import time

from asyncinfer.models.base import Result, WorkItem
from asyncinfer.models.registry import MODELS
from asyncinfer.models.schemas import GenerationInput
from asyncinfer.models.smollm2 import SmolLM2Handler
from asyncinfer.worker.outcomes import cost_fields

MODEL = "smollm2-135m-instruct"
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis to a child.",
    "List three colors.",
]


class _Source:
    def __init__(self, items: list[WorkItem]) -> None:
        self.todo = list(items)
        self.results: dict[str, Result] = {}

    @property
    def stopping(self) -> bool:
        return not self.todo

    def take(self, max_items: int, timeout: float) -> list[WorkItem]:
        out, self.todo = self.todo[:max_items], self.todo[max_items:]
        return out

    def finish(self, item: WorkItem, result: Result) -> None:
        self.results[item.job_id] = result


def run(handler: SmolLM2Handler, jobs: int, tokens: int, batch: int, price: float) -> str:
    """One row of the table (markdown) for ``jobs`` greedy jobs of ``tokens`` new tokens at
    ``batch`` jobs at most together."""
    items = [
        WorkItem(
            job_id=f"j{n}",
            input=GenerationInput.model_validate(
                {
                    "messages": [{"role": "user", "content": PROMPTS[n % len(PROMPTS)]}],
                    "max_new_tokens": tokens,
                }
            ),
        )
        for n in range(jobs)
    ]
    source = _Source(items)
    t0 = time.perf_counter()
    handler.serve(source, batch)
    wall = time.perf_counter() - t0
    generated = sum(
        r["usage"]["completion_tokens"] for r in source.results.values() if isinstance(r, dict)
    )
    compute = sum(i.compute_seconds for i in items)
    cost = sum(cost_fields(i.compute_seconds, price).get("cost_usd", 0.0) for i in items)
    per_1k = cost / max(1, generated) * 1000
    return (
        f"| {batch} | {wall:.2f} | {compute:.2f} | {compute / wall:.0%} | {generated} "
        f"| {generated / wall:.1f} | {per_1k:.6f} |"
    )


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--batches", default="1,4,16")
    args = parser.parse_args()
    spec = MODELS[MODEL]
    price = (spec.entry.compute.price_per_hour if spec.entry else None) or 0.805
    handler = SmolLM2Handler(spec=spec)
    handler.load()
    print(f"{MODEL}: {args.jobs} greedy jobs x {args.tokens} new tokens, ${price}/worker-hour")
    print("| batch | wall s | compute s (sum) | of wall | tokens | tokens/s | USD per 1k tokens |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for batch in (int(b) for b in args.batches.split(",")):
        print(run(handler, args.jobs, args.tokens, batch, price), flush=True)


if __name__ == "__main__":
    main()
