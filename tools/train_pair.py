"""Train the bundled draft/target pair: two small GPT-2s on Tiny Shakespeare, bytes as tokens.

Training-only tool (PyTorch on CPU, see tools/requirements-train.txt); nothing at runtime
imports it. The models are exactly GPT-2's architecture (Radford et al. 2019; the layout of
openai/gpt-2's model.py): pre-LN blocks, tanh-GELU, LayerNorm eps 1e-5, learned position
embeddings wpe, and a tied output head (logits = h @ wte.T). Every linear weight is stored
[in, out] like GPT-2's Conv1D, so y = x @ w + b here, in the checkpoint and in gpt2np, and the
export is a plain copy into gpt2np's params dict (docs/CONTRACTS.md).

Vocabulary: 257 ids = GPT-2's 256 byte tokens, in GPT-2's id order (the order of
`bytes_to_unicode`), plus <|endoftext|> = 256 (never seen in training). With no merges,
GPT-2's BPE maps every byte to one token, so a corpus byte b has id BYTE_TO_ID[b].

Pipeline: train the target on the data; train two drafts, one on the data ("plain") and one
by distillation from the target ("distilled": KL(target || draft) mixed with the data loss);
measure the acceptance rate alpha = E[sum_x min(p(x), q(x))] of each (teacher-forced on
validation text), keep the better; export both models in OpenAI's release layout.

    python tools/train_pair.py ../shared/data/corpus/tinyshakespeare.txt
"""
import argparse
import contextlib
import functools
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ModuleNotFoundError:  # --help and the argument checks work without it; main() says what to install
    torch = F = None

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # gpt2np from this checkout: its tokenizer and checkpoint writer
N_VOCAB = 257  # 256 byte tokens + <|endoftext|>
EPS = 1e-5     # GPT-2's LayerNorm epsilon


def gpt2_byte_order():
    """The byte that GPT-2's token id i stands for, i = 0..255 (the order of bytes_to_unicode).

    GPT-2 gives ids to printable bytes first ('!'..'~', then two Latin-1 ranges), then to the
    remaining 68 bytes (control characters, space, ...) in increasing order.
    >>> gpt2_byte_order()[:3], gpt2_byte_order()[220]  # '!', '"', '#', and the space byte (GPT-2's 'Ġ')
    ([33, 34, 35], 32)
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    return printable + [b for b in range(256) if b not in printable]


BYTE_TO_ID = np.argsort(gpt2_byte_order())  # [256] byte value -> token id


def encode_bytes(data):  # bytes -> [n] int64 token ids
    return BYTE_TO_ID[np.frombuffer(data, dtype=np.uint8)].astype(np.int64)


def no_grad(fn):  # torch.no_grad() as a decorator that needs torch only when called
    @functools.wraps(fn)
    def without_gradients(*args, **kwargs):
        with torch.no_grad():
            return fn(*args, **kwargs)
    return without_gradients


# ----------------------------------------------------------------------------- the model
class GPT2Torch(torch.nn.Module if torch is not None else object):
    """GPT-2 in torch whose parameters mirror gpt2np's params dict name by name."""

    def __init__(self, n_vocab, n_ctx, n_embd, n_head, n_layer):
        super().__init__()
        self.hparams = dict(n_vocab=n_vocab, n_ctx=n_ctx, n_embd=n_embd, n_head=n_head, n_layer=n_layer)
        E = n_embd
        P = lambda *shape: torch.nn.Parameter(torch.zeros(*shape))  # noqa: E731
        self.wte, self.wpe = P(n_vocab, E), P(n_ctx, E)
        self.blocks = torch.nn.ModuleList()
        for _ in range(n_layer):
            block = torch.nn.ParameterDict({
                "ln_1_g": P(E), "ln_1_b": P(E), "c_attn_w": P(E, 3 * E), "c_attn_b": P(3 * E),
                "attn_c_proj_w": P(E, E), "attn_c_proj_b": P(E), "ln_2_g": P(E), "ln_2_b": P(E),
                "c_fc_w": P(E, 4 * E), "c_fc_b": P(4 * E), "mlp_c_proj_w": P(4 * E, E), "mlp_c_proj_b": P(E)})
            self.blocks.append(block)
        self.ln_f_g, self.ln_f_b = P(E), P(E)

    def init_weights(self, generator):
        """GPT-2's init: N(0, 0.02) matrices, residual projections scaled by 1/sqrt(2 n_layer)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("_g"):
                    p.fill_(1.0)
                elif p.ndim == 2:
                    std = 0.02 / math.sqrt(2 * len(self.blocks)) if "c_proj" in name else 0.02
                    p.normal_(0.0, std, generator=generator)
                # biases and LayerNorm offsets stay 0

    def forward(self, ids):  # [B, T] -> [B, T, n_vocab]
        B, T = ids.shape
        E, H = self.wte.shape[1], self.hparams["n_head"]
        x = self.wte[ids] + self.wpe[:T]  # [B, T, E]
        for blk in self.blocks:
            h = F.layer_norm(x, (E,), blk["ln_1_g"], blk["ln_1_b"], EPS)
            qkv = h @ blk["c_attn_w"] + blk["c_attn_b"]  # [B, T, 3E]; Conv1D: w is [in, out]
            q, k, v = (t.view(B, T, H, E // H).transpose(1, 2) for t in qkv.split(E, dim=-1))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, d_head]
            a = a.transpose(1, 2).reshape(B, T, E)
            x = x + a @ blk["attn_c_proj_w"] + blk["attn_c_proj_b"]
            h = F.layer_norm(x, (E,), blk["ln_2_g"], blk["ln_2_b"], EPS)
            h = F.gelu(h @ blk["c_fc_w"] + blk["c_fc_b"], approximate="tanh")  # GPT-2's GELU
            x = x + h @ blk["mlp_c_proj_w"] + blk["mlp_c_proj_b"]
        x = F.layer_norm(x, (E,), self.ln_f_g, self.ln_f_b, EPS)
        return x @ self.wte.T  # tied output head

    def n_params(self):
        return sum(p.numel() for p in self.parameters())


def to_params(model):
    """The torch model as gpt2np's params dict (float32 numpy, docs/CONTRACTS.md): a copy."""
    t = lambda p: p.detach().cpu().numpy().astype(np.float32).copy()  # noqa: E731
    blocks = [{"ln_1": {"g": t(b["ln_1_g"]), "b": t(b["ln_1_b"])},
               "attn": {"c_attn": {"w": t(b["c_attn_w"]), "b": t(b["c_attn_b"])},
                        "c_proj": {"w": t(b["attn_c_proj_w"]), "b": t(b["attn_c_proj_b"])}},
               "ln_2": {"g": t(b["ln_2_g"]), "b": t(b["ln_2_b"])},
               "mlp": {"c_fc": {"w": t(b["c_fc_w"]), "b": t(b["c_fc_b"])},
                       "c_proj": {"w": t(b["mlp_c_proj_w"]), "b": t(b["mlp_c_proj_b"])}}}
              for b in model.blocks]
    return {"wte": t(model.wte), "wpe": t(model.wpe), "blocks": blocks,
            "ln_f": {"g": t(model.ln_f_g), "b": t(model.ln_f_b)}}


def from_params(params, n_head):
    """Build the torch model from a gpt2np params dict (the inverse of to_params)."""
    n_vocab, E = params["wte"].shape
    model = GPT2Torch(n_vocab, params["wpe"].shape[0], E, n_head, len(params["blocks"]))
    T = lambda a: torch.from_numpy(np.array(a, dtype=np.float32))  # noqa: E731  (a writable copy)
    with torch.no_grad():
        model.wte.copy_(T(params["wte"])), model.wpe.copy_(T(params["wpe"]))
        model.ln_f_g.copy_(T(params["ln_f"]["g"])), model.ln_f_b.copy_(T(params["ln_f"]["b"]))
        for blk, p in zip(model.blocks, params["blocks"]):
            pairs = {"ln_1": p["ln_1"], "c_attn": p["attn"]["c_attn"], "attn_c_proj": p["attn"]["c_proj"],
                     "ln_2": p["ln_2"], "c_fc": p["mlp"]["c_fc"], "mlp_c_proj": p["mlp"]["c_proj"]}
            for prefix, d in pairs.items():
                for key, value in d.items():
                    blk[f"{prefix}_{key}"].copy_(T(value))
    return model


# ----------------------------------------------------------------------------- training
def random_blocks(data, batch_size, n_ctx, generator):  # -> inputs, targets: [B, n_ctx] each
    """Random windows of n_ctx + 1 tokens: every one of the n_ctx positions gets a target."""
    starts = torch.randint(0, len(data) - n_ctx - 1, (batch_size,), generator=generator)
    window = torch.stack([data[s:s + n_ctx + 1] for s in starts.tolist()])  # [B, n_ctx + 1]
    return window[:, :-1], window[:, 1:]


def val_blocks(data, n_ctx):  # -> inputs, targets: [n_blocks, n_ctx]
    """All consecutive non-overlapping windows of the validation split."""
    n = (len(data) - 1) // n_ctx
    return data[: n * n_ctx].view(n, n_ctx), data[1: n * n_ctx + 1].view(n, n_ctx)


@no_grad
def mean_loss(model, x, y, batch_size=32):
    """Cross-entropy in nats per token (= nats per byte here), averaged over all positions."""
    total = sum(F.cross_entropy(model(x[i:i + batch_size]).flatten(0, 1), y[i:i + batch_size].flatten(),
                                reduction="sum").item() for i in range(0, len(x), batch_size))
    return total / y.numel()


def learning_rate(step, n_steps, peak, warmup=100):
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, n_steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model, name, train_data, val_xy, args, n_steps, teacher=None, mix=0.0):
    """AdamW on random blocks; with a teacher, loss = mix * KL(teacher || model) + (1-mix) * CE."""
    gen = torch.Generator().manual_seed(args.seed + 1)  # the same batches for every draft
    decay = [p for p in model.parameters() if p.ndim == 2]  # matrices decay, gains/biases don't
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.99))
    t0 = time.time()
    for step in range(n_steps):
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, n_steps, args.lr)
        x, y = random_blocks(train_data, args.batch_size, args.n_ctx, gen)
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        if teacher is not None:
            with torch.no_grad():
                log_q = F.log_softmax(teacher(x), dim=-1)  # the target's distribution
            kl = F.kl_div(F.log_softmax(logits, dim=-1), log_q, log_target=True, reduction="none").sum(-1)
            loss = mix * kl.mean() + (1 - mix) * loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == n_steps - 1:
            val = mean_loss(model, val_xy[0][:16], val_xy[1][:16])
            print(f"[{name}] step {step:5d}/{n_steps}  loss {loss.item():.4f}  val {val:.4f} (16 blocks)  "
                  f"lr {opt.param_groups[0]['lr']:.2e}  {time.time() - t0:6.0f}s", flush=True)
    return time.time() - t0


@no_grad
def acceptance(draft, target, x, temperatures=(1.0, 0.8, 0.6), batch_size=32):
    """Teacher-forced on x, gpt2np's notation (p = target, q = draft, both at temperature T):
    alpha(T) = mean over positions of sum_v min(p, q), and alpha(0) = mean[argmax p == argmax q],
    the acceptance rate of greedy speculative decoding. Returns {T: alpha}."""
    overlaps = {T: [] for T in (*temperatures, 0.0)}
    for i in range(0, len(x), batch_size):
        logits_p, logits_q = target(x[i:i + batch_size]), draft(x[i:i + batch_size])  # [B, T, n_vocab]
        for T in temperatures:
            p, q = F.softmax(logits_p / T, dim=-1), F.softmax(logits_q / T, dim=-1)
            overlaps[T].append(torch.minimum(p, q).sum(-1).flatten())
        overlaps[0.0].append((logits_p.argmax(-1) == logits_q.argmax(-1)).float().flatten())
    return {T: torch.cat(values).mean().item() for T, values in overlaps.items()}


# ----------------------------------------------------------------------------- export
def model_name(corpus_name, n_params):
    """'shakespeare-2.7M' style: the parameter count to two significant figures, like '124M'."""
    for unit, scale in (("M", 1e6), ("K", 1e3)):
        if n_params >= scale:
            value = float(f"{n_params / scale:.2g}")
            return f"{corpus_name}-{value:g}{unit}"
    return f"{corpus_name}-{n_params}"


def count_params(n_ctx, n_embd, n_head, n_layer):
    """GPT2Torch(...).n_params() without building it: gpt2np's count of the same GPT-2 (the head tied to wte)."""
    from gpt2np.model.config import GPT2Config
    return GPT2Config(n_vocab=N_VOCAB, n_ctx=n_ctx, n_embd=n_embd, n_head=n_head, n_layer=n_layer).n_params()


def export(model, out_dir, prompt_ids):
    """OpenAI's release layout (no model.ckpt.meta: nothing in gpt2np reads the graph), plus
    reference.npz: the torch logits for prompt_ids, which tests/checkpoints/test_bundled.py checks.
    Writes into out_dir as it is: export_models gives it a temporary folder."""
    from gpt2np.checkpoints.tf_writer import write_checkpoint
    from gpt2np.tokenizer.files import write_byte_level_vocab
    from gpt2np.checkpoints.weights import params_to_tf

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "hparams.json").write_text(json.dumps(model.hparams, indent=2) + "\n")
    write_checkpoint(str(out_dir / "model.ckpt"), params_to_tf(to_params(model)))
    write_byte_level_vocab(out_dir)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids]))[0].numpy().astype(np.float32)  # [n_seq, n_vocab]
    np.savez(out_dir / "reference.npz", tokens=np.array(prompt_ids, dtype=np.int64), logits=logits)


def export_models(models, out_dir, prompt_ids):
    """Each model {name: model} to out_dir/name, all or nothing: every model is written into a temporary
    folder beside its destination (.name.partial-*), and only when all are complete is each renamed into
    place. A model folder already there is left untouched until its replacement is complete, then moved
    aside and removed. A failure (or Ctrl-C) leaves no partial folder behind."""
    out_dir.mkdir(parents=True, exist_ok=True)
    staged = {}
    try:
        for name, model in models.items():
            staged[name] = Path(tempfile.mkdtemp(dir=out_dir, prefix=f".{name}.partial-"))
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(staged[name], 0o777 & ~umask)  # mkdtemp's 0700 -> what mkdir would have made
            export(model, staged[name], prompt_ids)
        for name in list(staged):
            replace_folder(staged[name], out_dir / name)
            del staged[name]
    finally:
        for folder in staged.values():
            shutil.rmtree(folder, ignore_errors=True)


def replace_folder(new, dest):
    """Rename the complete folder new to dest; a dest already there is moved aside first, and back on failure."""
    if not dest.exists():
        os.rename(new, dest)
        return
    aside = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.old-"))
    os.rename(dest, aside / dest.name)
    try:
        os.rename(new, dest)
    except BaseException:
        os.rename(aside / dest.name, dest)
        raise
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(aside)


def check_tokenizer_agrees(text, ids, vocab_dir):
    """gpt2np's tokenizer, given the byte-level vocabulary, must produce exactly our ids."""
    from gpt2np.tokenizer.bpe import Tokenizer
    from gpt2np.tokenizer.files import write_byte_level_vocab

    write_byte_level_vocab(vocab_dir)
    tok = Tokenizer.from_dir(vocab_dir)
    assert tok.n_vocab == N_VOCAB and tok.eot_id == N_VOCAB - 1, (tok.n_vocab, tok.eot_id)
    assert tok.encode(text) == ids.tolist(), "gpt2np's tokenizer disagrees with GPT-2's byte order"
    assert tok.decode(ids.tolist()) == text


# ----------------------------------------------------------------------------- main
class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def check_folder(path, flag):
    """path (a folder, made if missing) can be written in: the nearest folder that exists is tried by
    making and removing a temporary folder in it (os.access says yes to root, even on /proc)."""
    path = Path(path)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{flag} {path}: {existing} is not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".train_pair-probe-"))
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot write in {existing} ({e.strerror or e})") from None


def check_args(args):  # -> the corpus bytes, or a one-line ValueError naming the flag; before any work
    def positive(name, value, at_least=1):
        if value < at_least:
            raise ValueError(f"--{name} must be at least {at_least}, got {value}")

    corpus = Path(args.corpus)
    if not corpus.is_file():
        raise ValueError(f"corpus {corpus}: " + ("is not a file" if corpus.exists() else "no such file"))
    try:
        raw = corpus.read_bytes()
        raw.decode("utf-8")
    except OSError as e:
        raise ValueError(f"corpus {corpus}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"corpus {corpus}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    positive("n_ctx", args.n_ctx)
    for flag, spec in (("--target", args.target), ("--draft", args.draft)):
        n_embd, n_head, n_layer = spec
        if min(spec) < 1:
            raise ValueError(f"{flag} {n_embd} {n_head} {n_layer}: N_EMBD, N_HEAD and N_LAYER must each be at least 1")
        if n_embd % n_head:
            raise ValueError(f"{flag} {n_embd} {n_head} {n_layer}: N_EMBD must be a multiple of N_HEAD "
                             f"(each head gets N_EMBD / N_HEAD dimensions)")
    for name in ("target_steps", "draft_steps"):
        positive(name, getattr(args, name), at_least=0)
    for name in ("batch_size", "alpha_blocks", "log_every"):
        positive(name, getattr(args, name))
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise ValueError(f"--lr must be a positive number, got {args.lr}")
    if not 0 <= args.distill_mix <= 1:
        raise ValueError(f"--distill_mix must be in [0, 1], got {args.distill_mix}")
    n_train = int(0.9 * len(raw))
    if len(raw) - n_train < args.n_ctx + 1 or n_train < args.n_ctx + 2:
        raise ValueError(f"corpus {corpus}: {len(raw)} bytes is too short for --n_ctx {args.n_ctx}: the 10% "
                         f"validation split needs a block of n_ctx + 1 bytes (about {10 * (args.n_ctx + 1)} bytes in all)")
    n_prompt = len(args.prompt.encode("utf-8"))
    if not 1 <= n_prompt <= args.n_ctx:
        raise ValueError(f"--prompt must have 1 to --n_ctx {args.n_ctx} bytes, got {n_prompt}")
    name = args.corpus_name
    if not name or name.startswith(".") or "/" in name or os.sep in name:
        raise ValueError(f"--corpus_name must be a plain folder name (no '/', not starting with '.'), got {name!r}")
    names = [model_name(name, count_params(args.n_ctx, *spec)) for spec in (args.target, args.draft)]
    if names[0] == names[1]:
        raise ValueError(f"--target and --draft would both be exported as {names[0]} (the name rounds the "
                         f"parameter count to two figures): make them differ in size")
    check_folder(args.out_dir, "--out_dir")
    check_folder(args.work_dir, "--work_dir")
    return raw


def parse_args():  # -> args, the corpus bytes
    ap = OneLineParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("corpus", help="training text (UTF-8), e.g. ../shared/data/corpus/tinyshakespeare.txt")
    ap.add_argument("--corpus_name", default="shakespeare", help="first part of the model names")
    ap.add_argument("--out_dir", default=ROOT / "gpt2np" / "bundled", type=Path, help="models go to OUT_DIR/<name>/")
    ap.add_argument("--work_dir", default="/tmp/gpt2np-train", help="torch state dicts (not committed)")
    ap.add_argument("--reuse", action="store_true", help="load models already trained in WORK_DIR")
    ap.add_argument("--seed", type=int, default=1234,
                    help="seed of the initial weights and of the random training blocks")
    ap.add_argument("--n_ctx", type=int, default=256, help="context length in tokens (= bytes)")
    # target (n_embd, n_head, n_layer) and draft, as in hparams.json
    ap.add_argument("--target", type=int, nargs=3, default=[160, 5, 8], metavar=("N_EMBD", "N_HEAD", "N_LAYER"),
                    help="the target's width, heads and layers")
    ap.add_argument("--draft", type=int, nargs=3, default=[128, 4, 1], metavar=("N_EMBD", "N_HEAD", "N_LAYER"),
                    help="each draft's width, heads and layers")
    ap.add_argument("--target_steps", type=int, default=2000, help="optimizer steps for the target")
    ap.add_argument("--draft_steps", type=int, default=1500, help="optimizer steps for each draft")
    ap.add_argument("--batch_size", type=int, default=16, help="blocks of n_ctx tokens per step")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate")
    ap.add_argument("--distill_mix", type=float, default=0.9, help="weight of the KL term for the distilled draft")
    ap.add_argument("--alpha_blocks", type=int, default=64, help="validation blocks for measuring alpha")
    ap.add_argument("--log_every", type=int, default=100, help="steps between progress lines")
    ap.add_argument("--prompt", default="ROMEO:\nBut soft, what light through",
                    help="reference.npz prompt (at most n_ctx bytes)")
    args = ap.parse_args()
    try:
        raw = check_args(args)
    except ValueError as e:
        ap.error(str(e))
    if torch is None:
        ap.exit(2, f"{ap.prog}: error: torch is not installed (training only): "
                   f"pip install -r tools/requirements-train.txt --index-url https://download.pytorch.org/whl/cpu\n")
    return args, raw


def main():
    args, raw = parse_args()
    torch.set_num_threads(2)  # the 2-core budget
    torch.use_deterministic_algorithms(True)  # else wte's gradient (index_put) sums in thread order
    torch.manual_seed(args.seed)
    data = torch.from_numpy(encode_bytes(raw))
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    check_tokenizer_agrees(raw.decode("utf-8"), data.numpy(), work / "vocab")  # before, not after, training
    n_train = int(0.9 * len(data))  # 90/10 split: train on the first 90%, validate on the rest
    train_data, val_data = data[:n_train], data[n_train:]
    val_xy = val_blocks(val_data, args.n_ctx)
    print(f"corpus {args.corpus}: {len(raw)} bytes, train {n_train}, val {len(val_data)} "
          f"({len(val_xy[0])} blocks of {args.n_ctx})", flush=True)

    def build(spec, key):
        n_embd, n_head, n_layer = spec
        model = GPT2Torch(N_VOCAB, args.n_ctx, n_embd, n_head, n_layer)
        model.init_weights(torch.Generator().manual_seed(args.seed))
        print(f"{key}: n_embd {n_embd} n_head {n_head} n_layer {n_layer}: {model.n_params()} params", flush=True)
        return model

    def fit(model, key, steps, **kw):
        path = work / f"{key}.pt"
        if args.reuse and path.exists():
            model.load_state_dict(torch.load(path))
            return 0.0
        seconds = train(model, key, train_data, val_xy, args, steps, **kw)
        torch.save(model.state_dict(), path)
        return seconds

    target, plain, distilled = build(args.target, "target"), build(args.draft, "plain"), build(args.draft, "distilled")
    seconds = {"target": fit(target, "target", args.target_steps)}
    target.eval()
    seconds["plain"] = fit(plain, "plain", args.draft_steps)
    seconds["distilled"] = fit(distilled, "distilled", args.draft_steps, teacher=target, mix=args.distill_mix)
    x_alpha = val_xy[0][: args.alpha_blocks]
    alphas = {key: acceptance(m, target, x_alpha) for key, m in (("plain", plain), ("distilled", distilled))}
    for key, model in (("target", target), ("plain", plain), ("distilled", distilled)):
        alpha = "".join(f"  alpha(T={T:g}) {a:.4f}" for T, a in alphas.get(key, {}).items())
        print(f"final {key:9s}: val loss {mean_loss(model, *val_xy):.4f} nats/byte  "
              f"trained {seconds[key]:.0f}s{alpha}", flush=True)
    print(f"training time, all three models: {sum(seconds.values()) / 60:.1f} min", flush=True)
    best = max(alphas, key=lambda k: alphas[k][1.0])
    draft = {"plain": plain, "distilled": distilled}[best]
    print(f"keeping the {best} draft (higher alpha at temperature 1)", flush=True)
    prompt_ids = encode_bytes(args.prompt.encode("utf-8")).tolist()
    models = {model_name(args.corpus_name, model.n_params()): model for model in (target, draft)}
    export_models(models, args.out_dir, prompt_ids)
    for name, model in models.items():
        print(f"exported {name} ({model.n_params()} params) to {args.out_dir / name}", flush=True)


if __name__ == "__main__":
    main()
