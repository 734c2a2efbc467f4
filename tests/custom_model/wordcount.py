"""A custom ``python``-kind model for the tests (and the shape docs/models.md describes): it
loads its "weights" (a stop-word list from its ``source`` folder) once, then counts the words of
each job's ``text`` and returns the ``top`` most common ones."""

from __future__ import annotations

from collections import Counter
from typing import Any

from asyncinfer.models.base import ModelHandler, Result, WorkItem


class WordCount(ModelHandler):
    """``{"text": str, "top": int}`` -> ``{"words": int, "top": [[word, count], ...]}``."""

    def load(self) -> None:
        folder = self.spec.source_dir()
        assert folder is not None
        self.stopwords = set((folder / "stopwords.txt").read_text().split())

    def predict(self, items: list[WorkItem]) -> list[Result]:
        out: list[Result] = []
        for item in items:
            data: dict[str, Any] = item.raw_input
            words = [w for w in data["text"].lower().split() if w not in self.stopwords]
            top = Counter(words).most_common(int(data.get("top", 3)))
            out.append({"words": len(words), "top": [[w, n] for w, n in top], "batch": len(items)})
        return out
