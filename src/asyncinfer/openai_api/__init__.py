"""The OpenAI-compatible Batch surface (``../shared/spec/openai.md``): Files and Batches under
``/openai/v1``, in OpenAI's object shapes and error body, over the service's own jobs.

* :mod:`.errors`: OpenAI's error body and the mapping from the error taxonomy.
* :mod:`.files`: the tenant's files in S3 (``openai/files/<tenant>/<file_id>``).
"""
