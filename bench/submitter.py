"""The API side of ``bench/worker_throughput.py``'s runs b and c, in a process of its own (as the
API Lambda is in AWS and the Lambda pool is on the local stack), so that submitting does not
share the worker's interpreter.

    python -m bench.submitter MODEL     # environment: the stack's (table, queues, endpoint)

Protocol (JSON lines): it prints ``{"ready": true}`` once its clients are built, reads one line
holding the list of job inputs, submits them in order through
:class:`asyncinfer.jobs.service.JobService`
printing ``{"id": ..., "ts": <time.monotonic() before the submit>}`` for each, then prints
``{"counts": {operation: n}}``: the AWS requests the submits made (botocore ``after-call``)."""

from __future__ import annotations

import json
import sys
import time

from asyncinfer.core.settings import Settings
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.jobs.service import JobService
from bench.aws_counter import AwsRequestCounter


def main(argv: list[str]) -> int:
    model = argv[0]
    counter = AwsRequestCounter()
    counter.install()
    service = JobService(Settings.from_env().api)
    service.sqs.list_queues()  # clients built and connected before the window opens
    counter.reset()
    print(json.dumps({"ready": True}), flush=True)
    jobs = json.loads(sys.stdin.readline())
    for inp in jobs:
        ts = time.monotonic()
        job, _ = service.submit("bench", JobRequest(model=model, input=inp))
        print(json.dumps({"id": str(job["id"]), "ts": ts}), flush=True)
    print(json.dumps({"counts": dict(counter.snapshot())}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
