"""asyncinfer: asynchronous model inference on AWS.

The package holds every piece of logic that the API Lambda, the DLQ handler, the worker container
and the local stack share. Deployment folders (``lambdas/``, ``container/``, ``infra/``) only import
from here.
"""

__version__ = "0.1.0"
