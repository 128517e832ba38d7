"""Diagnostic (issue 29): how alike the digit tokens' input embeddings are in a tiny model, against ten
name pieces. Digits only ever appear in years, which a passage states and no context predicts, so
training pushes them toward one shared direction; a model that cannot tell '4' from '7' on input
cannot copy a year.

    .venv/bin/python benchmarks/credit_probes/digit_embeddings.py MODEL [MODEL ...]
"""
import sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def alike(emb: torch.Tensor) -> str:
    cos = torch.nn.functional.cosine_similarity(emb[:, None], emb[None], dim=-1)
    off = cos[~torch.eye(len(emb), dtype=torch.bool)]
    spread = (emb - emb.mean(0)).norm(dim=1).mean() / emb.norm(dim=1).mean()
    return f"mean cosine {off.mean():.2f}, norm {emb.norm(dim=1).mean():.2f}, centred/norm {spread:.2f}"


for path in sys.argv[1:]:
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    table = model.get_input_embeddings().weight.detach()
    digits = [tok.convert_tokens_to_ids(str(i)) for i in range(10)]
    pieces = [tok.convert_tokens_to_ids(p) for p in ["ul", "os", "is", "on", "ur", "lo", "pe", "de", "er", "ir"]]
    tied = model.lm_head.weight.data_ptr() == table.data_ptr()
    print(f"{path}: digits {alike(table[digits])} | name pieces {alike(table[pieces])} | tied {tied}")
