"""SmolLM2-135M-Instruct training speed on this CPU: fp32 vs bf16 autocast, full fine-tuning,
8 x 256 random tokens per step, AdamW (3 steps each, the same loaded model). Prints tokens/s
per step. Measures whether bf16 helps on the CPU (issue 11).

    .venv/bin/python benchmarks/smollm2_cpu_dtype.py fp32 bf16
"""
import time, torch, sys
from rlfactory.generation.model_source import load_model
from rlfactory.config import ModelConfig
t = time.time()
model, tok = load_model(ModelConfig(path="smollm2:135m", device="cpu"))
print("load", round(time.time() - t, 1), "threads", torch.get_num_threads(), flush=True)
ids = torch.randint(100, 40000, (8, 256))
for dtype in sys.argv[1:]:
    m = model if dtype == "fp32" else model
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5)
    m.train()
    for i in range(3):
        t = time.time()
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else torch.autocast("cpu", enabled=False)
        with ctx:
            out = m(input_ids=ids, labels=ids)
        out.loss.backward(); opt.step(); opt.zero_grad()
        dt = time.time() - t
        print(dtype, i, round(dt, 1), "s", round(8 * 256 / dt), "tok/s", flush=True)
