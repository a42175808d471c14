"""From a model name to a ready GPT2: resolve the name, download if needed, read weights and tokenizer.

A model can be named these ways, wherever gpt2np asks for one (main.py, console, server, API):
  * a size of OpenAI's release ("124M", "355M", "774M", "1558M"): looked up in models_dir/<size>/,
    downloaded there on first use; its hparams.json must be that size's preset (config.PRESETS).
    The Hub's names of the same weights mean the same: gpt2, gpt2-medium, gpt2-large, gpt2-xl,
    with or without "openai-community/" (HUB_SPELLINGS);
  * distilgpt2 (or distilbert/distilgpt2), which OpenAI never released: the Hub's hf:distilbert/distilgpt2;
  * random:<size> ("random:1558M", "random:gpt2-xl", "random:tiny"): random weights of that shape,
    built in memory with a fixed seed, so that a target and a draft of the same name are the same model;
  * a bundled model shipped inside the package (see gpt2np/bundled/README.md), e.g. the small
    Shakespeare pair that makes `python main.py` work offline;
  * a Hugging Face Hub name, hf:owner/name[@revision] (hub.py): downloaded into models_dir/owner/name/;
  * a path to any folder in the release layout (hparams.json, model.ckpt.*, encoder.json, vocab.bpe)
    or in the Hugging Face layout (config.json, model.safetensors, vocab.json, merges.txt:
    hf_layout.py), including a snapshot in the Hub's cache (models--owner--name/snapshots/<rev>/),
    or the models--owner--name folder itself (its refs/main snapshot).
"""
import difflib
import os
import re
from pathlib import Path

import numpy as np

from ..model.config import PRESETS, GPT2Config
from .download import download_model
from .hf_layout import is_hf_folder, load_hf_params, read_hf_config
from .hub import HUB_FILES, HUB_PREFIX, download_hub_model
from ..model.fast.layout import order_as_loaded
from ..model.forward import GPT2
from ..tokenizer.files import load_hf_tokenizer, load_tokenizer
from .weights import init_params, load_params

RELEASE_SIZES = ("124M", "355M", "774M", "1558M")
BUNDLED_DIR = Path(__file__).parents[1] / "bundled"  # gpt2np/bundled
MODEL_FILES = ("hparams.json", "model.ckpt.index", "model.ckpt.data-00000-of-00001")
TOKENIZER_FILES = ("encoder.json", "vocab.bpe")
DISTILGPT2 = "hf:distilbert/distilgpt2"
HUB_SPELLINGS = {  # the Hub's names -> gpt2np's: OpenAI's release is the same weights (and --mirror applies)
    **{f"{owner}{name}": size for owner in ("", "openai-community/") for name, size in
       (("gpt2", "124M"), ("gpt2-medium", "355M"), ("gpt2-large", "774M"), ("gpt2-xl", "1558M"))},
    "distilgpt2": DISTILGPT2, "distilbert/distilgpt2": DISTILGPT2,
}
RANDOM_PREFIX, RANDOM_SEED = "random:", 0
RANDOM_SHAPES = {**PRESETS, "distilgpt2": GPT2Config(n_vocab=50257, n_ctx=1024, n_embd=768, n_head=12, n_layer=6)}
HUB_LIKE = re.compile(r"[\w.-]+/[\w.-]+")  # owner/name, as the Hub spells a repository


def bundled_models():
    """Names of the models shipped inside the package."""
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "hparams.json").is_file())


def canonical_name(name):
    """The Hub's spelling of a GPT-2 -> the name gpt2np resolves; any other name as it is.

    >>> canonical_name("gpt2-xl"), canonical_name("openai-community/gpt2"), canonical_name("distilgpt2")
    ('1558M', '124M', 'hf:distilbert/distilgpt2')
    """
    return HUB_SPELLINGS.get(str(name).lower(), str(name))


def random_config(name):
    """"random:<size>" -> the GPT2Config of that size (a PRESETS name, or a Hub spelling of one)."""
    shape = name[len(RANDOM_PREFIX):]
    config = RANDOM_SHAPES.get(canonical_name(shape)) or RANDOM_SHAPES.get(shape.lower())  # distilgpt2: its shape
    if config is None:
        raise ValueError(f"{name!r}: random weights need a shape: random:<size> with a size of "
                         f"{', '.join(RANDOM_SHAPES)}, or gpt2, gpt2-medium, gpt2-large, gpt2-xl")
    return config


def known_n_vocab(name_or_dir):
    """The vocabulary size load_model(name_or_dir) gives, where the name alone says it: random:<size>'s
    shape; None for any other (its files say it as it loads).

    >>> known_n_vocab("random:124M"), known_n_vocab("random:tiny"), known_n_vocab("124M")
    (50257, 64, None)
    """
    return random_config(str(name_or_dir)).n_vocab if str(name_or_dir).startswith(RANDOM_PREFIX) else None


class UnknownModelError(ValueError):
    """A name that is no model gpt2np knows (unknown_model words it): .name is the name as given."""

    def __init__(self, message, name):
        super().__init__(message)
        self.name = name


def known_names(drafter=False, none=True):
    """The names gpt2np resolves without a folder: the release's (both spellings), distilgpt2, the bundled
    models; for a drafter also "ngram" (prompt lookup) and "none" (no drafter), where a command takes it (none)."""
    return [*(name for name in HUB_SPELLINGS if "/" not in name), *RELEASE_SIZES, *bundled_models(),
            *(("ngram",) if drafter else ()), *(("none",) if drafter and none else ())]


def did_you_mean(name, names):  # -> " (did you mean X?)", or ""
    """The known name closest to a mistyped one (difflib), letter case ignored: shakespeare-2.6m -> shakespeare-2.6M.

    >>> did_you_mean("shakespeare-2.6m", ["shakespeare-2.6M", "shakespeare-260K"])
    ' (did you mean shakespeare-2.6M?)'
    """
    lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.lower(), list(lower), n=1, cutoff=0.75)
    return f" (did you mean {lower[close[0]]}?)" if close else ""


def looks_like_path(name):
    """./x, ../x, /x, ~/x, or a/b/c: a folder meant, not a name (owner/name is the Hub's spelling)."""
    return name.startswith((".", "/", "~")) or (os.sep in name and not HUB_LIKE.fullmatch(name))


def unknown_model(name, drafter=False, none=True):
    """The one-line error for a name that is no model gpt2np knows: what it does know, and the closest
    known name. A name that looks like a path is a folder that is not there. drafter: the name was given
    as a drafter, where "ngram" and (none=True: the command runs the target alone) "none" are choices too."""
    if looks_like_path(name):
        return UnknownModelError(f"no such folder: {name}", name)
    names = ", ".join(("gpt2, gpt2-medium, gpt2-large, gpt2-xl (= " + ", ".join(RELEASE_SIZES) + ")",
                       "distilgpt2", *bundled_models()))
    if HUB_LIKE.fullmatch(name):  # someone's Hub repository: GPT-2s load as hf:owner/name
        hint = (f" (a GPT-2 on the Hub is named hf:{name})" if "gpt2" in name.lower()
                else " (gpt2np runs the GPT-2 family only; bloom, llama, opt... are other architectures)")
    else:
        hint = did_you_mean(name, known_names(drafter, none))
    rest = ("a model folder, ngram (prompt lookup, no model), or none (no drafter: the target alone)"
            if drafter and none else "a model folder, or ngram (prompt lookup, no model)" if drafter
            else "or a model folder")
    return UnknownModelError(f"unknown model {name!r}{hint}: use one of {names}, hf:owner/name (a GPT-2 on the "
                             f"Hub), {RANDOM_PREFIX}<size> (random weights), {rest}", name)


def resolve_model_dir(name_or_dir, models_dir="weights", base_url=None, hf_endpoint=None):
    """Return the folder holding the named model, downloading a release size or Hub model if missing."""
    name = canonical_name(name_or_dir)
    if name.startswith(RANDOM_PREFIX):
        raise ValueError(f"{name!r} has no folder: random weights are built in memory (load_model)")
    if name in RELEASE_SIZES or name.startswith(HUB_PREFIX):
        check_models_dir(models_dir)  # before a download makes folders in it
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
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{name} is a file, not a model folder: name the folder that holds its model files")
    if not folder.is_dir():
        raise unknown_model(name)
    check_model_files(folder)
    return folder


def check_models_dir(models_dir):
    """models_dir, or the first of its parents that exists, must be a folder: a NotADirectoryError naming it
    ("models_dir X is not a folder": a command says its flag, report.command_error_line), not errno 20 at a mkdir."""
    there = next((p for p in (Path(models_dir), *Path(models_dir).parents) if p.exists()), None)
    if there is not None and not there.is_dir():
        inside = "" if there == Path(models_dir) else f" ({there} is a file)"
        raise NotADirectoryError(f"models_dir {models_dir} is not a folder{inside}")


def check_model_files(folder):
    """A folder must hold the files of one layout; the error names the missing files of the layout it is
    closest to (the one more of whose files are there): model.safetensors, vocab.json and merges.txt without
    config.json miss config.json, not hparams.json and model.ckpt.*, which that folder was never meant to hold."""
    def present(files):
        return sum((folder / f).is_file() for f in files)
    openai, hf = present(MODEL_FILES + TOKENIZER_FILES), present(HUB_FILES)
    if is_hf_folder(folder) or hf > openai:
        missing = [f for f in HUB_FILES if not (folder / f).is_file()]
        layout = f"the Hugging Face layout: {', '.join(HUB_FILES)}"
    else:
        missing = [f for f in MODEL_FILES if not (folder / f).is_file()]
        layout = (f"OpenAI's release layout; or {', '.join(HUB_FILES)} in the Hugging Face layout" if not hf + openai
                  else f"OpenAI's release layout: {', '.join(MODEL_FILES + TOKENIZER_FILES)}")
    if missing:
        raise FileNotFoundError(f"{folder} is not a model folder: missing {', '.join(missing)} ({layout})")


def hub_cache_snapshot(folder):
    """models--owner--name/ in the Hub's cache -> its snapshots/<refs/main>/; any other folder as is.

    A refs/main that is empty or names a snapshot that is not there (a cache pruned by hand or half
    copied) is said as such, with the snapshots there are: resolving it anyway would end in "unknown
    model" for a folder that exists, or in "snapshots is not a model folder"."""
    ref = folder / "refs" / "main"
    if not (folder.name.startswith("models--") and ref.is_file()):
        return folder
    revision = ref.read_text(encoding="utf-8", errors="replace").strip()
    snapshots = folder / "snapshots"
    there = sorted(p.name for p in snapshots.iterdir() if p.is_dir()) if snapshots.is_dir() else []
    there = f"the snapshots there: {', '.join(there)}" if there else f"{snapshots} holds none"
    if not revision:
        raise FileNotFoundError(f"{ref} is empty: it should name the snapshot to load ({there}; "
                                f"name a snapshot folder instead)")
    if Path(revision).name != revision or revision in (".", "..") or "\n" in revision:  # one name, no path
        raise FileNotFoundError(f"{ref} holds {revision[:80]!r}, not a snapshot name ({there})")
    if not (snapshots / revision).is_dir():
        raise FileNotFoundError(f"{ref} names snapshot {revision[:80]!r}, which is missing from {snapshots} ({there})")
    return snapshots / revision


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
    if str(name_or_dir).startswith(RANDOM_PREFIX):
        return load_random(str(name_or_dir), models_dir)
    folder = resolve_model_dir(name_or_dir, models_dir, base_url, hf_endpoint)
    hf = is_hf_folder(folder)
    config = read_config(folder)
    if canonical_name(name_or_dir) in RELEASE_SIZES:  # a size name is a promise: refuse before writing a cache
        config.check_preset(canonical_name(name_or_dir), folder / "hparams.json")
    # the bundled models load uncached: a cache would be written into the installed package, which pip does not
    # remove, and their checkpoints load as fast (2.6M: 6 ms from its memory maps, 14 ms from the cache)
    bundled = Path(folder).resolve().parent == BUNDLED_DIR.resolve()
    params = load_hf_params(folder, config) if hf else load_params(folder, config, cache=not bundled)
    if tokenizer_dir is None and hf:
        tokenizer = load_hf_tokenizer(folder, fast=fast_tokenizer)
    else:
        tokenizer = load_tokenizer(Path(tokenizer_dir or folder), fast=fast_tokenizer)
    if tokenizer.n_vocab != config.n_vocab:
        raise ValueError(f"{folder}: the tokenizer has {tokenizer.n_vocab} tokens but "
                         f"{'config.json' if hf else 'hparams.json'} says n_vocab={config.n_vocab}")
    return order_as_loaded(GPT2(config, params, tokenizer, name=str(name_or_dir)))


def has_tokenizer(name_or_dir, models_dir="weights"):
    """Whether load_model(name_or_dir, models_dir) gives a model with a tokenizer, told before any loading:
    False only for random weights whose vocabulary finds none (random_model's "auto": GPT-2's files in a
    folder of models_dir, or the byte-level one); every other model loads with its tokenizer or not at all.
    A caller that reads or writes text refuses here, not after the init (random:1558M: about 30 s).

    >>> has_tokenizer("124M"), has_tokenizer("random:tiny")  # a release size; 64 tokens, no tokenizer of that size
    (True, False)
    """
    if not str(name_or_dir).startswith(RANDOM_PREFIX):
        return True
    from ..tokenizer.files import tokenizer_for  # here: the module's imports belong to name resolution
    return tokenizer_for(random_config(str(name_or_dir)).n_vocab, "auto", models_dir) is not None


def load_random(name, models_dir="weights"):
    """"random:<size>": random_model of that shape with RANDOM_SEED, named as asked (same name, same
    weights); its tokenizer is random_model's choice (GPT-2's files are looked for in models_dir)."""
    model = random_model(random_config(name), seed=RANDOM_SEED, models_dir=models_dir)
    model.name = name
    return model


def random_model(config, seed=0, std=0.02, tokenizer="auto", models_dir="weights"):
    """A GPT2 with random weights of any shape (benchmarks and tests need 124M-1558M without downloads).

    tokenizer="auto" gives it GPT-2's when n_vocab is 50257 and OpenAI's encoder.json + vocab.bpe are
    in a folder of models_dir (weights/124M/, ...: nothing is downloaded), the byte-level one when
    n_vocab is 257, else none; or pass None, a tokenizer (a real model's, to pair with it) or a
    folder (tokenizer.files.tokenizer_for). With a tokenizer comes eot_id, which ends generation.
    """
    from ..tokenizer.files import tokenizer_for  # here: the module's imports belong to name resolution
    check_config(config)
    tokenizer = tokenizer_for(config.n_vocab, tokenizer, models_dir)  # first: a bad one costs no init
    params = init_params(config, np.random.default_rng(seed), std=std)
    return order_as_loaded(GPT2(config, params, tokenizer, name=f"random {config.n_params() / 1e6:.1f}M"))


def check_config(config):
    """random_model's config must be a GPT2Config: a size name ("124M") would fail deep in the init as a
    str without n_vocab; the error names the preset to pass (load_model("random:124M") is the by-name way)."""
    if not isinstance(config, GPT2Config):
        size = config if isinstance(config, str) and config in PRESETS else "124M"
        raise ValueError(f"config must be a GPT2Config, e.g. gpt2np.PRESETS[{size!r}] (sizes: {', '.join(PRESETS)}), "
                         f"got {type(config).__name__} {config!r:.40}")
