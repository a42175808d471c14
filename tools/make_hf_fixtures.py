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
"""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
sys.path.insert(0, str(OUT.parents[1]))
from gpt2np.tokenizer.bpe import BYTE_TO_SYMBOL, EOT  # noqa: E402  (after the path)

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


def build(name, seed, save):
    folder = OUT / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
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
    print(f"{folder}: {size / 1024:.0f} KiB, {len(ids)} tokens, logits max |x| {np.abs(ref['logits']).max():.2f}")


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


if __name__ == "__main__":
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    build("hf-tiny-f32", 1, save_f32)
    build("hf-tiny-f16", 2, save_f16)
    build("hf-tiny-noprefix", 3, save_noprefix)
