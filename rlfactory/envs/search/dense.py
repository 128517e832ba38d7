"""Dense retrieval: any Hugging Face encoder folder (e5, bge, ...: mean-pooled, L2-normalised
embeddings, inner product = cosine) and a FAISS index (`faiss-cpu`; `pip install 'rlfactory[dense]'`):
flat (exact), hnsw (graph, approximate) or ivf (inverted lists; nprobe of nlist searched).
Moved to the GPUs when GPU FAISS is installed and sees one."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

FAISS_KINDS = ("flat", "hnsw", "ivf")


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as e:
        raise ImportError(f"dense retrieval needs faiss: pip install 'rlfactory[dense]' ({e})") from None
    return faiss


class Encoder:
    """Texts -> float32 [n, dim] unit vectors from an encoder folder (`AutoModel` + `AutoTokenizer`).
    e5-style prefixes ("query: ", "passage: ") are set per use."""

    def __init__(self, folder: str | Path, max_length: int = 256) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.folder, self.max_length, self._torch = str(folder), max_length, torch
        self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        self.model = AutoModel.from_pretrained(self.folder).eval()

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        torch = self._torch
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), batch_size):
                batch = self.tokenizer(list(texts[i:i + batch_size]), padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt")
                hidden = self.model(**batch).last_hidden_state  # [b, t, d]
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [b, t, 1]
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # mean over real tokens
                out.append(torch.nn.functional.normalize(pooled.float(), dim=-1).numpy())
        return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)


class DenseIndex:
    """Encoder + FAISS index over passages; `search(query, k)` -> [(position, cosine)]."""

    def __init__(self, encoder: Encoder, index: Any, kind: str, nlist: int | None, query_prefix: str,
                 passage_prefix: str) -> None:
        self.encoder, self.index, self.kind, self.nlist = encoder, index, kind, nlist
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.n_docs = int(index.ntotal)

    @classmethod
    def build(cls, texts: Sequence[str], encoder: str | Path, kind: str = "flat", *, nlist: int | None = None,
              hnsw_m: int = 32, batch_size: int = 64, query_prefix: str = "query: ", passage_prefix: str = "passage: ",
              progress: bool = False) -> "DenseIndex":
        faiss = _faiss()
        if kind not in FAISS_KINDS:
            raise ValueError(f"unknown FAISS index {kind!r} (one of {', '.join(FAISS_KINDS)})")
        enc = Encoder(encoder)
        from tqdm.auto import tqdm

        chunks = []
        for i in tqdm(range(0, len(texts), 4096), desc="encode", unit="chunk", file=sys.stderr, disable=not progress):
            chunks.append(enc.encode([passage_prefix + t for t in texts[i:i + 4096]], batch_size))
        vectors = np.ascontiguousarray(np.concatenate(chunks), dtype=np.float32)
        dim = vectors.shape[1]
        if kind == "flat":
            index = faiss.IndexFlatIP(dim)
        elif kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        else:
            nlist = nlist or max(1, int(4 * np.sqrt(len(vectors))))
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
            index.train(vectors)
        index.add(vectors)
        return cls(enc, index, kind, nlist if kind == "ivf" else None, query_prefix, passage_prefix)

    def save(self, folder: str | Path) -> None:
        faiss = _faiss()
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self.index, str(folder / "faiss.index"))
        (folder / "dense.json").write_text(json.dumps({
            "encoder": str(Path(self.encoder.folder).resolve()), "kind": self.kind, "nlist": self.nlist,
            "query_prefix": self.query_prefix, "passage_prefix": self.passage_prefix}))

    @classmethod
    def load(cls, folder: str | Path, nprobe: int | None = None, ef_search: int = 64) -> "DenseIndex":
        faiss = _faiss()
        meta = json.loads((Path(folder) / "dense.json").read_text())
        index = faiss.read_index(str(Path(folder) / "faiss.index"))
        if meta["kind"] == "ivf":
            index.nprobe = nprobe or max(1, (meta["nlist"] or 1) // 8)
        elif meta["kind"] == "hnsw":
            index.hnsw.efSearch = ef_search
        if hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0:
            index = faiss.index_cpu_to_all_gpus(index)
        return cls(Encoder(meta["encoder"]), index, meta["kind"], meta["nlist"], meta["query_prefix"],
                   meta["passage_prefix"])

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        k = max(0, min(k, self.n_docs))
        if k == 0:
            return []
        scores, ids = self.index.search(self.encoder.encode([self.query_prefix + query]), k)
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]
