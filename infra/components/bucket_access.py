"""Which functions read, write and delete which prefixes of the data bucket (issue 14, item 8:
least privilege), and the grants that give them exactly that.

The bucket's layout (the code that builds the keys):

* ``inputs/<tenant>/<job id>.json``: large job inputs
  (:class:`asyncinfer.aws.payloads.PayloadStore`);
* ``outputs/<tenant>/<job id>.json``: large job outputs; SageMaker's under ``outputs/sagemaker/``
  (:mod:`infra.components.sagemaker_endpoints`);
* ``uploads/<tenant>/<ulid>.json``: ``POST /v1/uploads``
  (:func:`asyncinfer.jobs.inputs.upload_prefix`);
* ``openai/files/<tenant>/<file id>``: OpenAI Files (:func:`asyncinfer.openai_api.files.file_key`);
* ``openai/batches/<tenant>/<batch id>/chunk-<k>.json``: a batch's validated requests
  (:func:`asyncinfer.openai_api.chunks.chunk_key`).

Reads are CDK's ``grant_read`` (``s3:GetObject*`` on the prefix, which HEAD and CopyObject's
source take too, plus ``s3:GetBucket*``/``s3:List*`` on the bucket itself: listing shows key
names, never content); writes ``grant_put`` (``s3:PutObject`` and ``s3:Abort*``: a presigned PUT
or POST needs PutObject on the key by the role that signs it, and CopyObject on its destination);
deletes ``grant_delete`` (``s3:DeleteObject*``). No access here covers the whole bucket.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3

INPUTS = "inputs/*"
OUTPUTS = "outputs/*"
UPLOADS = "uploads/*"
FILES = "openai/files/*"
CHUNKS = "openai/batches/*"
#: Every prefix pattern a function of this module may be granted (cdk-nag acknowledges each).
PREFIXES = (INPUTS, OUTPUTS, UPLOADS, FILES, CHUNKS)


@dataclass(frozen=True)
class BucketAccess:
    """Object key patterns (``prefix/*``) a function reads, writes and deletes."""

    read: tuple[str, ...] = ()
    put: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()


#: The API Lambda (``/v1`` and ``/openai/v1``).
API = BucketAccess(
    # presigned GETs of outputs; an upload copied into a file (HEAD, CopyObject source); Files'
    # HEAD, GET, listing and presigned GET.
    read=(OUTPUTS, UPLOADS, FILES),
    # large inputs at submit; the presigned PUT and POST of POST /v1/uploads; Files created
    # (multipart, or copied from an upload).
    put=(INPUTS, UPLOADS, FILES),
    # the input of a submit that failed part way (taken back); DELETE /openai/v1/files/{id}.
    delete=(INPUTS, FILES),
)
#: The OpenAI batch expander: validates the input file, stores the chunks, submits each line as
#: the API does, and finalizes a batch ended early or missed by the counter.
BATCH_EXPANDER = BucketAccess(
    read=(FILES, CHUNKS, OUTPUTS),
    put=(CHUNKS, INPUTS, FILES),
    delete=(INPUTS,),
)
#: The OpenAI batch line counter: finalizes a batch (its unexpanded lines from the chunks, the
#: lines' outputs) into its output and error files.
BATCH_COUNTER = BucketAccess(
    read=(CHUNKS, OUTPUTS),
    put=(FILES,),
)


def grant(bucket: s3.IBucket, grantee: iam.IGrantable, access: BucketAccess) -> None:
    """Grant ``grantee`` exactly ``access`` on ``bucket``: reads, then writes, then deletes."""
    for objects in access.read:
        bucket.grant_read(grantee, objects)
    for objects in access.put:
        bucket.grant_put(grantee, objects)
    for objects in access.delete:
        bucket.grant_delete(grantee, objects)
