"""``compute=sagemaker``: the SQS -> InvokeEndpointAsync bridge (:mod:`.bridge`), the
notification handler that finishes jobs (:mod:`.completion`), and the container's SageMaker
serving contract, GET /ping and POST /invocations on port 8080 (:mod:`.server`)."""
