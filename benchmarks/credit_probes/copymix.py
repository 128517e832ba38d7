"""Probe (issue 29): mix generic copy documents (rlfactory/tiny/copy_corpus.answer_doc: tool response ->
answer, numbers of 1-8 digits) into the SFT's full-text steps: COPYMIX_FRAC of each full-text batch's
rows are copy documents. Runs the rlfactory CLI with the SFT loop so patched (one padded pass a step):

    .venv/bin/python benchmarks/credit_probes/copymix.py demo --out OUT algo.advantage=grpo
"""
import os, random, sys, time, math
import torch
import rlfactory.train.sft as sft_mod
from rlfactory.trajectory import Segment, Trajectory

FRAC = float(os.environ.get("COPYMIX_FRAC", "0.25"))
KIND = os.environ.get("COPYMIX_KIND", "answer")
_orig = sft_mod.sft_train
_tok = {}


def _copy_trajs(tok, n, seed=0):
    from rlfactory.tiny import copy_corpus
    rng = random.Random(f"copymix:{seed}")
    out = []
    for i in range(n):
        text = copy_corpus.answer_doc(rng) if KIND == "answer" or (KIND == "both" and i % 2) else copy_corpus.recall_doc(rng)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        out.append(Trajectory(id=f"copy{i}", group=f"copy{i}", segments=[Segment("prompt", ids[:1]), Segment("model", ids[1:])], turns=1))
    return out


def patched(model, demos, pad_id, cfg, log=None, pixels=None):
    from rlfactory.train.batch import collate
    from rlfactory.train.logprobs import policy_forward
    from rlfactory.train.sft import full_text_view, _lr_factor, step_generator
    tok = _tok["tok"]
    copies = _copy_trajs(tok, 4096)
    print(f"copymix: {FRAC} of full-text rows are {KIND} copy docs; mean {sum(len(c.input_ids) for c in copies)/len(copies):.0f} tokens", file=sys.stderr)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, cfg))
    model.train()
    history = []
    n_copy = int(round(cfg.batch_size * FRAC))
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        g = step_generator(cfg.seed, step, "sft")
        full_text = step < cfg.full_text_steps
        k = cfg.batch_size - (n_copy if full_text else 0)
        idx = torch.randint(len(demos), (k,), generator=g).tolist()
        chosen = [full_text_view(demos[i]) if full_text else demos[i] for i in idx]
        if full_text and n_copy:
            cidx = torch.randint(len(copies), (n_copy,), generator=g).tolist()
            chosen += [copies[i] for i in cidx]
        batch = collate(chosen, pad_id, None)
        logp, _ = policy_forward(model, batch, bf16=cfg.bf16)
        mask = batch.loss_mask
        loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step(); sched.step()
        with torch.no_grad():
            acc = ((logp.exp() > 0.5).float() * mask).sum() / mask.sum().clamp(min=1)
        row = {"step": step + 1, "loss": loss.item(), "token_acc": acc.item(), "lr": sched.get_last_lr()[0], "full_text": full_text,
               "tokens_per_s": batch.num_tokens() / (time.perf_counter() - t0)}
        history.append(row)
        if log is not None:
            log(row)
    model.eval()
    return history


sft_mod.sft_train = patched
import rlfactory.train.session as sess
_orig_pad = sess.pad_id_of
def pad_id_of(tokenizer, model):
    _tok["tok"] = tokenizer
    return _orig_pad(tokenizer, model)
sess.pad_id_of = pad_id_of

if __name__ == "__main__":
    from rlfactory.cli.main import main
    sys.exit(main(sys.argv[1:]))
