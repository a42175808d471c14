"""random_model pairs with real models (issue 27, item 5).

A random model gets a tokenizer, so that it can stand in for a real draft or target: GPT-2's when
its vocabulary is 50257 and OpenAI's files are in a folder of models_dir (nothing is downloaded),
the byte-level one when it is 257 (the bundled models'), else none; or the one you pass. And when a
pair still differs, the error says what differs ("the draft has no tokenizer"), not
"n_vocab 50257 vs 50257, eot_id 50256 vs None".
"""
import shutil

import pytest

import gpt2np
from gpt2np.model.config import PRESETS, GPT2Config
from gpt2np.tokenizer.files import load_tokenizer, tokenizer_for

GPT2_VOCAB = GPT2Config(n_vocab=50257, n_ctx=32, n_embd=16, n_head=2, n_layer=1)  # 124M's vocabulary, tiny rest
BYTE_VOCAB = GPT2Config(n_vocab=257, n_ctx=64, n_embd=16, n_head=2, n_layer=1)


@pytest.fixture
def models_dir(tmp_path, bpe_dir):
    """A models_dir as load_model leaves it after downloading 124M: weights/124M/encoder.json, ..."""
    for name in ("encoder.json", "vocab.bpe"):
        (tmp_path / "124M").mkdir(exist_ok=True)
        shutil.copy(bpe_dir / name, tmp_path / "124M" / name)
    return tmp_path


def one_line(info):
    message = str(info.value)
    assert "\n" not in message and len(message) < 240, message
    return message


def test_gpt2_sized_random_model_gets_gpt2s_tokenizer_from_models_dir(models_dir, bpe_dir):
    model = gpt2np.random_model(GPT2_VOCAB, models_dir=models_dir)
    assert model.tokenizer.fingerprint == load_tokenizer(bpe_dir, fast=False).fingerprint
    assert model.eot_id == 50256 and model.tokenizer.encode("Hello, world!") == [15496, 11, 995, 0]
    again = gpt2np.random_model(GPT2_VOCAB, seed=1, models_dir=models_dir)
    assert again.tokenizer is model.tokenizer  # read once per process: ~1 s for GPT-2's files


def test_without_the_files_there_is_no_tokenizer_and_the_error_says_so(models_dir, tmp_path_factory):
    """The issue's case: a random 50257-token draft beside a model with GPT-2's tokenizer."""
    target = gpt2np.random_model(GPT2_VOCAB, models_dir=models_dir)
    draft = gpt2np.random_model(GPT2_VOCAB, seed=1, models_dir=tmp_path_factory.mktemp("empty"))
    assert draft.tokenizer is None and draft.eot_id is None
    with pytest.raises(ValueError) as info:
        gpt2np.speculative_generate(target, draft, [464], 4)
    message = one_line(info)
    assert "the draft has no tokenizer, hence no end-of-text id (the target's is 50256)" in message
    assert "random_model(config, tokenizer=target.tokenizer)" in message and "50257 vs 50257" not in message
    with pytest.raises(ValueError, match="the target has no tokenizer"):
        gpt2np.speculative_generate(draft, target, [464], 4)
    fixed = gpt2np.random_model(GPT2_VOCAB, seed=1, tokenizer=target.tokenizer)  # what the message says
    assert gpt2np.speculative_generate(target, fixed, [464], 4).tokens == gpt2np.generate(target, [464], 4)

def test_load_drafter_refuses_a_random_draft_of_another_vocabulary_before_its_init(monkeypatch):
    """load_drafter(name, target=target): random:<size> says its vocabulary's size, so a draft of another is
    refused before its weights are built (random:1558M's take about 30 s); any other draft is checked once
    loaded (its files say its size)."""
    from gpt2np.checkpoints import loading
    target = gpt2np.load_model("shakespeare-2.6M")  # 257 tokens
    built = []
    init_params = loading.init_params
    monkeypatch.setattr(loading, "init_params", lambda *a, **k: built.append(a) or init_params(*a, **k))
    for name, size in (("random:1558M", 50257), ("random:tiny", 64)):
        with pytest.raises(ValueError) as info:
            gpt2np.load_drafter(name, target=target)
        assert one_line(info) == f"draft and target must share a vocabulary: n_vocab {size} vs 257 (draft vs " \
            "target)" and built == [], (one_line(info), len(built))
    with pytest.raises(ValueError, match=r"n_vocab 257 vs 64 \(draft vs target\)"):  # a bundled draft's size:
        gpt2np.load_drafter("shakespeare-260K", target=gpt2np.load_model("random:tiny"))  # known once loaded
    assert gpt2np.load_drafter("shakespeare-260K", target=target).model.n_vocab == 257
    assert gpt2np.load_drafter("random:tiny").model.n_vocab == 64 and len(built) == 2  # no target: built (as the target above)


def test_a_tokenizer_folder_works_too(bpe_dir, tmp_path):
    model = gpt2np.random_model(GPT2_VOCAB, tokenizer=bpe_dir, models_dir=tmp_path)
    assert model.eot_id == 50256
    assert gpt2np.random_model(GPT2_VOCAB, tokenizer=str(bpe_dir)).tokenizer is model.tokenizer  # one read


def test_byte_level_random_model_pairs_with_the_bundled_models():
    target = gpt2np.load_model("shakespeare-2.6M")
    draft = gpt2np.random_model(BYTE_VOCAB, seed=3)
    assert draft.tokenizer.fingerprint == target.tokenizer.fingerprint and draft.eot_id == target.eot_id == 256
    ids = target.tokenizer.encode("ROMEO:")
    result = gpt2np.speculative_generate(target, draft, ids, 12, K=3)
    assert result.tokens == gpt2np.generate(target, ids, 12)
    assert isinstance(draft.tokenizer.decode(gpt2np.generate(draft, ids, 5)), str)


def test_other_vocabularies_get_no_tokenizer_and_none_can_be_asked_for():
    assert gpt2np.random_model(PRESETS["tiny"]).tokenizer is None  # 64 tokens: no tokenizer fits
    model = gpt2np.random_model(BYTE_VOCAB, tokenizer=None)
    assert model.tokenizer is None and model.eot_id is None


def test_the_vocabulary_error_still_names_other_differences():
    byte_level = gpt2np.random_model(BYTE_VOCAB)
    with pytest.raises(ValueError) as info:
        gpt2np.speculative_generate(byte_level, gpt2np.random_model(PRESETS["tiny"]), [1, 2], 3)
    assert one_line(info).endswith("n_vocab 64 vs 257 (draft vs target)")
    bare = gpt2np.random_model(BYTE_VOCAB, tokenizer=None)
    no_tokenizer = r"the draft has no tokenizer, hence no end-of-text id \(the target's is 256\)"
    with pytest.raises(ValueError, match=no_tokenizer):
        gpt2np.speculative_generate(byte_level, bare, [1, 2], 3)


@pytest.mark.parametrize("tokenizer, message", [
    (lambda: tokenizer_for(257), "tokenizer has 257 tokens but the model's n_vocab is 64"),
    (lambda: 5, 'tokenizer must be "auto", None, a tokenizer or a tokenizer folder, got int'),
    (lambda: "no/such/folder", "encoder.json not found"),
])
def test_a_tokenizer_that_does_not_fit_is_a_one_line_error_before_the_weights(tokenizer, message, monkeypatch):
    import gpt2np.checkpoints.loading as loading
    monkeypatch.setattr(loading, "init_params", lambda *a, **k: pytest.fail("weights drawn before the check"))
    with pytest.raises((ValueError, FileNotFoundError), match=message) as info:
        gpt2np.random_model(PRESETS["tiny"], tokenizer=tokenizer())
    one_line(info)


def test_auto_looks_only_for_openais_exact_files(tmp_path):
    """A folder whose encoder.json is not OpenAI's (a byte-level one here) is not taken for GPT-2's."""
    from gpt2np.tokenizer.files import write_byte_level_vocab
    write_byte_level_vocab(tmp_path / "124M")
    assert tokenizer_for(50257, "auto", tmp_path) is None
    assert tokenizer_for(257, "auto", tmp_path).encode("hi") == [71, 72]
