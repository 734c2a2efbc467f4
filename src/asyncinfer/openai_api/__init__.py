"""The OpenAI-compatible Batch surface (``../shared/spec/openai.md``): Files and Batches under
``/openai/v1``, in OpenAI's object shapes and error body, over the service's own jobs.

* :mod:`.app`: the surface's Powertools resolver; the API Lambda hands it ``/openai/`` requests.
* :mod:`.auth`: which API key a request carries (``x-api-key`` or ``Authorization: Bearer``).
* :mod:`.authorizer`: the Lambda REQUEST authorizer of the CDK app (key -> usage identifier).
* :mod:`.errors`: OpenAI's error body and the mapping from the error taxonomy.
* :mod:`.files`: the tenant's files in S3 (``openai/files/<tenant>/<file_id>``).
* :mod:`.limits`: where API Gateway and Lambda cut bodies; the binary media types.
* :mod:`.multipart`: ``multipart/form-data`` bodies.
* :mod:`.routes_files`: the Files routes.
"""
