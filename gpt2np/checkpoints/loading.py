"""From a model name to a ready GPT2: resolve the name, download if needed, read weights and tokenizer.

A model can be named three ways, wherever gpt2np asks for one:
  * a size of OpenAI's release ("124M", "355M", "774M", "1558M"): looked up in models_dir/<size>/,
    downloaded there on first use; its hparams.json must be that size's preset (config.PRESETS);
  * a bundled model shipped inside the package (see gpt2np/bundled/README.md), e.g. the small
    Shakespeare pair that makes `python main.py` work offline;
  * a Hugging Face Hub name, hf:owner/name[@revision] (hub.py): downloaded into models_dir/owner/name/;
  * a path to any folder in the release layout (hparams.json, model.ckpt.*, encoder.json, vocab.bpe)
    or in the Hugging Face layout (config.json, model.safetensors, vocab.json, merges.txt:
    hf_layout.py), including a snapshot in the Hub's cache (models--owner--name/snapshots/<rev>/),
    or the models--owner--name folder itself (its refs/main snapshot).
"""
from pathlib import Path

import numpy as np

from ..model.config import GPT2Config
from .download import download_model
from .hf_layout import is_hf_folder, load_hf_params, read_hf_config
from .hub import HUB_FILES, HUB_PREFIX, download_hub_model
from ..model.forward import GPT2
from ..tokenizer.files import load_hf_tokenizer, load_tokenizer
from .weights import init_params, load_params

RELEASE_SIZES = ("124M", "355M", "774M", "1558M")
BUNDLED_DIR = Path(__file__).parents[1] / "bundled"  # gpt2np/bundled
MODEL_FILES = ("hparams.json", "model.ckpt.index", "model.ckpt.data-00000-of-00001")
TOKENIZER_FILES = ("encoder.json", "vocab.bpe")


def bundled_models():
    """Names of the models shipped inside the package."""
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "hparams.json").is_file())


def resolve_model_dir(name_or_dir, models_dir="weights", base_url=None, hf_endpoint=None):
    """Return the folder holding the named model, downloading a release size or Hub model if missing."""
    name = str(name_or_dir)
    if name in RELEASE_SIZES:
        folder = Path(models_dir) / name
        if not all((folder / f).is_file() for f in MODEL_FILES + TOKENIZER_FILES):
            download_model(name, models_dir, base_url=base_url)
        return folder
    if name.startswith(HUB_PREFIX):
        return download_hub_model(name, models_dir, endpoint=hf_endpoint)
    if name in bundled_models():
        return BUNDLED_DIR / name
    folder = hub_cache_snapshot(Path(name))
    if not folder.is_dir():
        known = ", ".join(RELEASE_SIZES + tuple(bundled_models()))
        raise ValueError(f"unknown model {name!r}: use one of {known}, hf:owner/name, or a model folder")
    missing = [f for f in (HUB_FILES if is_hf_folder(folder) else MODEL_FILES) if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} is not a model folder: missing {', '.join(missing)}")
    return folder


def hub_cache_snapshot(folder):
    """models--owner--name/ in the Hub's cache -> its snapshots/<refs/main>/; any other folder as is."""
    ref = folder / "refs" / "main"
    if folder.name.startswith("models--") and ref.is_file():
        return folder / "snapshots" / ref.read_text(encoding="utf-8").strip()
    return folder


def read_config(folder):
    """The GPT2Config of a model folder in either layout (config.json or hparams.json)."""
    if is_hf_folder(folder):
        return read_hf_config(folder)
    return GPT2Config.from_hparams_json(Path(folder) / "hparams.json")


def load_model(name_or_dir, models_dir="weights", base_url=None, tokenizer_dir=None, fast_tokenizer=True,
               hf_endpoint=None):
    """Load a GPT-2 by size name, bundled name, Hub name or folder; see the module docstring.

    The tokenizer files are taken from the model folder, or from tokenizer_dir (encoder.json +
    vocab.bpe) if given.
    """
    folder = resolve_model_dir(name_or_dir, models_dir, base_url, hf_endpoint)
    hf = is_hf_folder(folder)
    config = read_config(folder)
    if str(name_or_dir) in RELEASE_SIZES:  # a size name is a promise: refuse before writing a cache
        config.check_preset(str(name_or_dir), folder / "hparams.json")
    params = load_hf_params(folder, config) if hf else load_params(folder, config)
    if tokenizer_dir is None and hf:
        tokenizer = load_hf_tokenizer(folder, fast=fast_tokenizer)
    else:
        tokenizer = load_tokenizer(Path(tokenizer_dir or folder), fast=fast_tokenizer)
    if tokenizer.n_vocab != config.n_vocab:
        raise ValueError(f"{folder}: the tokenizer has {tokenizer.n_vocab} tokens but "
                         f"{'config.json' if hf else 'hparams.json'} says n_vocab={config.n_vocab}")
    return GPT2(config, params, tokenizer, name=str(name_or_dir))


def random_model(config, seed=0, std=0.02):
    """A GPT2 with random weights of any shape (benchmarks and tests need 124M-1558M without downloads)."""
    params = init_params(config, np.random.default_rng(seed), std=std)
    return GPT2(config, params, name=f"random {config.n_params() / 1e6:.1f}M")
