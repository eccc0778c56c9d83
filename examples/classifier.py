"""Model composition: a text classifier over the embeddings of another deployment.

Two BatchedDeployments, each its own Service, each scaled on its own (Ray Serve's "individually
scalable models composed into a single model"): `minilm` (examples/minilm.yaml) turns text into
sentence embeddings; `sentiment` (examples/sentiment.yaml) names it in `model.calls` and its
constructor receives a handle to it, `embedder`. For each text of a batch the classifier awaits
`self.embedder.remote(text)`; those calls, from every batch and every sentiment replica, wait in
minilm's queue beside everybody else's and are embedded together, 32 at a time.

The classifier itself needs no training: `labels` gives a few example texts per label, and a text
gets the label whose examples' mean embedding (centroid) it is closest to.

    batchd serve examples/minilm.yaml --port 8001
    batchd serve examples/sentiment.yaml --call embedder=http://127.0.0.1:8001
    curl -X POST localhost:8000/v1/models/sentiment:predict -d '{"instances": ["What a lovely day"]}'
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from batchd.replica.handles import DeploymentHandle


class EmbeddingClassifier:
    def __init__(self, embedder: DeploymentHandle, labels: dict[str, list[str]]) -> None:
        if not labels or not all(labels.values()):
            raise ValueError("labels: give at least one example text for each label")
        self.embedder = embedder
        self.labels = labels
        self._centroids: tuple[list[str], np.ndarray] | None = None
        self._lock = asyncio.Lock()

    async def classify(self, texts: list[str]) -> list[dict[str, Any]]:
        names, centroids = await self._label_centroids()
        # One call per text, all at once: the embedder batches them with everybody else's.
        vectors = _unit(np.array(await asyncio.gather(*(self.embedder.remote(text) for text in texts))))
        similarity = vectors @ centroids.T  # [texts, labels], cosine
        best = similarity.argmax(axis=1)
        return [
            {"label": names[index], "score": round(float(row[index]), 4)}
            for index, row in zip(best, similarity, strict=True)
        ]

    async def _label_centroids(self) -> tuple[list[str], np.ndarray]:
        """The labels' centroids, embedded by the embedder on first use (it may start after us)."""
        async with self._lock:
            if self._centroids is None:
                names = list(self.labels)
                examples = await asyncio.gather(*(self.embedder.remote_many(self.labels[n]) for n in names))
                centroids = np.array([_unit(np.array(vectors)).mean(axis=0) for vectors in examples])
                self._centroids = names, _unit(centroids)
            return self._centroids


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms: np.ndarray = np.linalg.norm(vectors, axis=-1, keepdims=True)
    unit: np.ndarray = vectors / np.clip(norms, 1e-12, None)
    return unit
