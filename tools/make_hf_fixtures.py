"""Build tests/fixtures/hf-tiny-*: tiny random GPT-2s saved by transformers, with HF's own logits.

    pip install -r tools/requirements-hf.txt     # torch (CPU build), transformers, safetensors
    python tools/make_hf_fixtures.py             # rewrites tests/fixtures/hf-tiny-{f32,f16,noprefix}/

Each folder is what `save_pretrained` writes (config.json, model.safetensors, ...), plus a
tokenizer of our own making (vocab.json + merges.txt: GPT-2's 256 byte symbols, a few merges and
<|endoftext|>, since OpenAI's 50257-token files are third-party and too big for a fixture) and
reference.npz, computed here by transformers (torch and transformers are tool-only dependencies;
the tests read only these files):
  tokens, text     a text and its ids by transformers' GPT2Tokenizer (texts_* for more texts)
  logits           GPT2LMHeadModel's float32 logits for tokens, [n_seq, n_vocab]
  logits_native    (f16 only) the same model run in float16 by torch, to measure the precision lost
The three models: f32 (GPT2LMHeadModel, float32), f16 (the same kind of model saved in float16;
`logits` is its float16 weights run in float32, which is what gpt2np computes), and noprefix (a
bare GPT2Model: tensor names without "transformer.", as in OpenAI's gpt2 repository on the Hub).
Weights are drawn larger than HF's 0.02 initialisation, so that logits are far from uniform.
Each folder is written under a temporary name beside it and renamed into place only when complete.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

try:
    import torch
    import transformers
except ModuleNotFoundError as e:  # --help works without them; main() names the requirements file
    torch = transformers = None
    MISSING = e.name

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
sys.path.insert(0, str(OUT.parents[1]))
from gpt2np.tokenizer.bpe import BYTE_TO_SYMBOL, EOT  # noqa: E402  (after the path)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/, for train_pair's replace_folder
from train_pair import replace_folder  # noqa: E402  (a finished folder renamed into place, as the pair's export)

MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "u"),
          ("Ġ", "s"), ("in", "g"), ("Ġ", "w")]
TEXT = "The weather in the south was warm, and singing went on.<|endoftext|>Then: ünïcödé 42!"
TEXTS = ["the theory", "  leading  spaces\n\nand newlines\t", "<|endoftext|>", "naïve café — 😀", ""]


def write_tokenizer(folder):
    """vocab.json + merges.txt: ids 0..255 the byte symbols, then one id per merge, then <|endoftext|>."""
    vocab = {symbol: i for i, symbol in enumerate(BYTE_TO_SYMBOL.values())}
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    vocab[EOT] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES),
                                       encoding="utf-8")
    return len(vocab)


def random_model(n_vocab, seed):
    config = transformers.GPT2Config(vocab_size=n_vocab, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                     activation_function="gelu_new", attn_implementation="eager",
                                     bos_token_id=n_vocab - 1, eos_token_id=n_vocab - 1)
    model = transformers.GPT2LMHeadModel(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
    return model


def logits_of(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def build(name, seed, save, out=OUT):
    """out/name, written into a temporary folder beside it and renamed into place when complete: a failure
    leaves the fixture there as it was (and no partial folder)."""
    out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(dir=out, prefix=f".{name}.partial-"))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(folder, 0o777 & ~umask)  # mkdtemp's 0700 -> what mkdir would have made
        written = write_fixture(folder, seed, save)
        replace_folder(folder, out / name)
        print(f"{out / name}: {written}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # gone already where it was renamed into place




def write_fixture(folder, seed, save):  # -> what was written, in words
    n_vocab = write_tokenizer(folder)
    tok = transformers.GPT2Tokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    ids = tok.encode(TEXT)
    model = random_model(n_vocab, seed)
    extra = save(model, folder)
    ref = {"text": np.array(TEXT), "tokens": np.array(ids), **extra}
    ref.setdefault("logits", logits_of(model, ids))
    for i, text in enumerate(TEXTS):
        ref[f"text_{i}"], ref[f"texts_{i}"] = np.array(text), np.array(tok.encode(text), dtype=np.int64)
    np.savez_compressed(folder / "reference.npz", **ref)
    size = sum(f.stat().st_size for f in folder.iterdir())
    return f"{size / 1024:.0f} KiB, {len(ids)} tokens, logits max |x| {np.abs(ref['logits']).max():.2f}"


def save_f32(model, folder):
    model.save_pretrained(folder)
    return {}


def save_f16(model, folder):
    model.half().save_pretrained(folder)
    upcast = transformers.GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32,
                                                          attn_implementation="eager").eval()
    ids = transformers.GPT2Tokenizer(str(folder / "vocab.json"), str(folder / "merges.txt")).encode(TEXT)
    return {"logits": logits_of(upcast, ids), "logits_native": logits_of(model, ids)}


def save_noprefix(model, folder):
    model.transformer.save_pretrained(folder)  # a bare GPT2Model: h.0..., wte.weight, no lm_head
    return {}


FIXTURES = {"hf-tiny-f32": (1, save_f32), "hf-tiny-f16": (2, save_f16), "hf-tiny-noprefix": (3, save_noprefix)}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python tools/make_hf_fixtures.py", description=__doc__.split("\n")[0],
                                     epilog="needs torch and transformers: pip install -r tools/requirements-hf.txt")
    parser.add_argument("--out_dir", type=Path, default=OUT, help="where the fixture folders go (default: "
                        "tests/fixtures, rewriting the committed ones)")
    args = parser.parse_args(argv)
    if torch is None:
        parser.exit(2, f"{parser.prog}: error: {MISSING} is not installed: pip install -r tools/requirements-hf.txt "
                       f"(torch CPU build, transformers, safetensors)\n")
    if args.out_dir.exists() and not args.out_dir.is_dir():
        parser.exit(2, f"{parser.prog}: error: --out_dir {args.out_dir} is not a folder\n")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for name, (seed, save) in FIXTURES.items():
        build(name, seed, save, args.out_dir)


if __name__ == "__main__":
    main()
