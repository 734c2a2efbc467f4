"""The ``openai-server`` kind (issue 16): a worker that feeds an OpenAI-compatible engine
(:mod:`.handler`), and ``asyncinfer serve-openai``, which serves a ``causal-lm`` entry of the
catalogue through the same HTTP API (:mod:`.serve`)."""
