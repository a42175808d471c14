"""GPT2Config: the five numbers that define a GPT-2 model, named exactly as in hparams.json.

OpenAI's release ships one `hparams.json` per size, e.g. for 124M:
    {"n_vocab": 50257, "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12}

>>> GPT2Config.from_hparams({"n_vocab": 64, "n_ctx": 32, "n_embd": 16, "n_head": 2, "n_layer": 2})
GPT2Config(n_vocab=64, n_ctx=32, n_embd=16, n_head=2, n_layer=2)
>>> PRESETS["124M"].n_params()
124439808
"""
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GPT2Config:
    n_vocab: int  # vocabulary size (50257 for GPT-2: 256 bytes + 50000 merges + <|endoftext|>)
    n_ctx: int    # longest sequence the model can see (rows of the position embedding wpe)
    n_embd: int   # width of the residual stream
    n_head: int   # attention heads; each head has d_head = n_embd // n_head dimensions
    n_layer: int  # transformer blocks

    def __post_init__(self):
        for name, value in asdict(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GPT2Config.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")

    @property
    def d_head(self):
        return self.n_embd // self.n_head

    @classmethod
    def from_hparams(cls, hparams):
        """Build from a dict with the hparams.json keys; extra keys are an error (a typo is not a default)."""
        names = {"n_vocab", "n_ctx", "n_embd", "n_head", "n_layer"}
        if set(hparams) != names:
            raise ValueError(f"hparams must have exactly the keys {sorted(names)}, got {sorted(hparams)}")
        return cls(**{k: hparams[k] for k in names})

    @classmethod
    def from_hparams_json(cls, path):
        with open(path, encoding="utf-8") as f:
            try:
                hparams = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} is not valid JSON: {e}") from None
        return cls.from_hparams(hparams)

    def n_params(self):
        """Number of float32 parameters, as stored in the checkpoint (the output head is wte, tied)."""
        E, L = self.n_embd, self.n_layer
        per_block = 4 * E + (E * 3 * E + 3 * E) + (E * E + E) + (E * 4 * E + 4 * E) + (4 * E * E + E)
        return self.n_vocab * E + self.n_ctx * E + L * per_block + 2 * E


PRESETS = {
    "124M": GPT2Config(n_vocab=50257, n_ctx=1024, n_embd=768, n_head=12, n_layer=12),
    "355M": GPT2Config(n_vocab=50257, n_ctx=1024, n_embd=1024, n_head=16, n_layer=24),
    "774M": GPT2Config(n_vocab=50257, n_ctx=1024, n_embd=1280, n_head=20, n_layer=36),
    "1558M": GPT2Config(n_vocab=50257, n_ctx=1024, n_embd=1600, n_head=25, n_layer=48),
    "tiny": GPT2Config(n_vocab=64, n_ctx=32, n_embd=16, n_head=2, n_layer=2),  # tests, notebooks
}
