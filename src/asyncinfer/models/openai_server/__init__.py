"""The ``openai-server`` kind (issue 16): a worker that feeds an OpenAI-compatible engine
(:mod:`.handler`), ``asyncinfer serve-openai``, which serves a ``causal-lm`` (or ``embeddings``)
entry of the catalogue through the same HTTP API (:mod:`.serve`), and the bodies of such an
engine as a SageMaker endpoint's container (:mod:`.invocations`)."""
