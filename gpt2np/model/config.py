"""GPT2Config: the five numbers that define a GPT-2 model, named exactly as in hparams.json.

OpenAI's release ships one `hparams.json` per size, e.g. for 124M:
    {"n_vocab": 50257, "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12}

>>> GPT2Config.from_hparams({"n_vocab": 64, "n_ctx": 32, "n_embd": 16, "n_head": 2, "n_layer": 2})
GPT2Config(n_vocab=64, n_ctx=32, n_embd=16, n_head=2, n_layer=2)
>>> PRESETS["124M"].n_params()
124439808

hparams.json comes from whoever serves the files, so every field is checked before anything is
sized from it: a positive integer (not a bool, float or null) no larger than LIMITS.
>>> GPT2Config.from_hparams({"n_vocab": 64, "n_ctx": 32, "n_embd": 16, "n_head": 2, "n_layer": 99999999999})
Traceback (most recent call last):
ValueError: GPT2Config.n_layer must be at most 1,024, got 99,999,999,999
"""
import json
from dataclasses import asdict, dataclass

# Largest value accepted per field: far above every GPT-2 (shown) and any model a NumPy forward
# pass can serve, far below sizes whose name table or KV cache alone would exhaust memory
# (n_layer 99999999999 used to grow a 16 GB dict before the first tensor was read).
LIMITS = {
    "n_vocab": 1 << 20,  # 1,048,576  (GPT-2: 50,257)
    "n_ctx": 1 << 16,    # 65,536     (GPT-2: 1,024)
    "n_embd": 1 << 15,   # 32,768     (1558M: 1,600)
    "n_head": 1 << 10,   # 1,024      (1558M: 25)
    "n_layer": 1 << 10,  # 1,024      (1558M: 48)
}
HPARAMS_MAX_BYTES = 1 << 16  # a real hparams.json is ~85 bytes; never read a huge one into memory


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
            if value > LIMITS[name]:
                raise ValueError(f"GPT2Config.{name} must be at most {LIMITS[name]:,}, got {value:,}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")

    @property
    def d_head(self):
        return self.n_embd // self.n_head

    @classmethod
    def from_hparams(cls, hparams):
        """Build from a dict with the hparams.json keys; extra keys are an error (a typo is not a default)."""
        names = {"n_vocab", "n_ctx", "n_embd", "n_head", "n_layer"}
        if not isinstance(hparams, dict):
            raise ValueError(f"hparams must be a JSON object with the keys {sorted(names)}, "
                             f"got {type(hparams).__name__}")
        if set(hparams) != names:
            raise ValueError(f"hparams must have exactly the keys {sorted(names)}, got {sorted(hparams)}")
        return cls(**{k: hparams[k] for k in names})

    @classmethod
    def from_hparams_json(cls, path):
        """Read and check hparams.json; any problem is one ValueError line naming the file."""
        with open(path, "rb") as f:
            raw = f.read(HPARAMS_MAX_BYTES + 1)
        if len(raw) > HPARAMS_MAX_BYTES:
            raise ValueError(f"{path} is larger than {HPARAMS_MAX_BYTES:,} bytes: not an hparams.json")
        try:
            return cls.from_hparams(json.loads(raw))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        except ValueError as e:  # also UnicodeDecodeError, and ints past Python's digit limit
            raise ValueError(f"{path}: {e}") from None

    def check_preset(self, size, source):
        """Raise unless this config is PRESETS[size]: a size name is a promise about the model."""
        if self != PRESETS[size]:
            raise ValueError(f"{source} describes {self}, but {size} is {PRESETS[size]}; "
                             f"a size name must hold that size (name the folder to load another model)")

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
