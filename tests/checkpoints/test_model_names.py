"""Model names as the Hub spells them, random:<size>, and other families' names: resolved without
the network (a models_dir of placeholder files, and a downloader that records what it was asked)."""

import numpy as np
import pytest

import gpt2np
from conftest import FIXTURES, copy_fixture
from gpt2np.checkpoints import loading
from gpt2np.checkpoints.loading import MODEL_FILES, TOKENIZER_FILES, random_config, resolve_model_dir

RELEASE_SPELLINGS = {"gpt2": "124M", "gpt2-medium": "355M", "gpt2-large": "774M", "gpt2-xl": "1558M"}


@pytest.fixture
def release_dir(tmp_path):
    """A models_dir whose four size folders hold every file resolve_model_dir looks for (empty)."""
    for size in RELEASE_SPELLINGS.values():
        (tmp_path / size).mkdir()
        for name in MODEL_FILES + TOKENIZER_FILES:
            (tmp_path / size / name).touch()
    return tmp_path


@pytest.fixture
def no_network(monkeypatch):
    """Both downloaders replaced by recorders: [(kind, what, where, source)] of each call."""
    calls = []
    monkeypatch.setattr(loading, "download_model", lambda size, models_dir, base_url=None:
                        calls.append(("release", size, models_dir, base_url)))
    monkeypatch.setattr(loading, "download_hub_model", lambda name, models_dir, endpoint=None:
                        calls.append(("hub", name, models_dir, endpoint)) or models_dir)
    return calls


@pytest.mark.parametrize("owner", ["", "openai-community/", "OpenAI-Community/"])
@pytest.mark.parametrize("name, size", RELEASE_SPELLINGS.items())
def test_hub_names_of_openais_release_are_its_size_folders(release_dir, no_network, owner, name, size):
    assert resolve_model_dir(owner + name, release_dir) == release_dir / size
    assert no_network == []  # the files are there: nothing fetched


@pytest.mark.parametrize("name, size", RELEASE_SPELLINGS.items())
def test_a_missing_release_name_downloads_its_size_from_the_mirror(tmp_path, no_network, name, size):
    resolve_model_dir(name, tmp_path, base_url="http://mirror.example/gpt-2/models")
    assert no_network == [("release", size, tmp_path, "http://mirror.example/gpt-2/models")]


@pytest.mark.parametrize("name", ["distilgpt2", "distilbert/distilgpt2", "DistilGPT2"])
def test_distilgpt2_comes_from_the_hub(tmp_path, no_network, name):
    resolve_model_dir(name, tmp_path, hf_endpoint="http://hub.example")
    assert no_network == [("hub", "hf:distilbert/distilgpt2", tmp_path, "http://hub.example")]


def test_a_release_name_promises_its_size(tmp_path):
    """gpt2 is 124M, as a size name is: a 124M/ folder holding another model is refused, naming both."""
    copy_fixture(FIXTURES / "gpt2-tiny-a", tmp_path / "124M")
    for name in TOKENIZER_FILES:
        (tmp_path / "124M" / name).touch()
    with pytest.raises(ValueError, match="124M") as info:
        gpt2np.load_model("gpt2", tmp_path)
    assert "n_embd=32" in str(info.value) and len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("name, hint", [
    ("bigscience/bloom-560m", "GPT-2 family only"),
    ("meta-llama/Llama-2-7b-hf", "GPT-2 family only"),
    ("facebook/opt-125m", "GPT-2 family only"),
    ("someone/gpt2-finetuned", "hf:someone/gpt2-finetuned"),
    ("llama-7b", "unknown model"),
])
def test_other_families_get_one_line_naming_what_is_supported(tmp_path, no_network, monkeypatch, name, hint):
    monkeypatch.chdir(tmp_path)  # no folder of that name here
    with pytest.raises(ValueError) as info:
        gpt2np.load_model(name, tmp_path)
    message = str(info.value)
    assert hint in message and len(message.splitlines()) == 1, message
    for supported in ("gpt2, gpt2-medium, gpt2-large, gpt2-xl", "distilgpt2", "hf:owner/name", "random:<size>"):
        assert supported in message, (supported, message)
    assert no_network == []


def test_a_folder_spelled_like_owner_slash_name_is_still_a_folder(tmp_path, monkeypatch):
    copy_fixture(FIXTURES / "hf-tiny-f32", tmp_path / "bigscience" / "tiny")
    monkeypatch.chdir(tmp_path)
    model = gpt2np.load_model("bigscience/tiny", tmp_path / "models")
    assert model.config.n_layer >= 1 and model.name == "bigscience/tiny"


@pytest.mark.parametrize("name, preset", [
    ("random:tiny", "tiny"), ("random:1558M", "1558M"), ("random:gpt2-xl", "1558M"), ("random:gpt2", "124M"),
    ("random:openai-community/gpt2-medium", "355M"), ("random:774M", "774M"),
])
def test_random_names_have_the_preset_shapes(name, preset):
    assert random_config(name) == gpt2np.PRESETS[preset]


def test_random_distilgpt2_has_its_six_layers():
    config = random_config("random:distilgpt2")
    assert (config.n_layer, config.n_embd, config.n_vocab) == (6, 768, 50257)


def test_a_random_name_is_the_same_model_every_time(tmp_path):
    """A fixed seed: the target and the draft of one name are the same weights, wherever it is named."""
    a, b = gpt2np.load_model("random:tiny", tmp_path), gpt2np.load_drafter("random:tiny", tmp_path).model
    assert a.config == gpt2np.PRESETS["tiny"] and a.name == "random:tiny"
    np.testing.assert_array_equal(a.params["wte"], b.params["wte"])
    ids = [1, 2, 3]
    np.testing.assert_array_equal(a.forward(ids, a.new_cache(), 3), b.forward(ids, b.new_cache(), 3))


def test_random_names_need_a_shape_and_have_no_folder(tmp_path):
    with pytest.raises(ValueError, match="random:<size> with a size of 124M") as info:
        gpt2np.load_model("random:huge", tmp_path)
    assert len(str(info.value).splitlines()) == 1
    with pytest.raises(ValueError, match="no folder"):
        resolve_model_dir("random:tiny", tmp_path)


@pytest.mark.parametrize("name", ["./nosuchdir", "../nosuch", "/x/y", "~/models/x", "models/gpt2/x"])
def test_a_path_that_is_not_there_is_no_such_folder_not_another_family(tmp_path, no_network, monkeypatch, name):
    """'./nosuchdir' used to get 'gpt2np runs the GPT-2 family only; bloom, llama...': it is a folder typed wrong."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as info:
        gpt2np.load_model(name, tmp_path)
    assert str(info.value) == f"no such folder: {name}" and no_network == []


@pytest.mark.parametrize("name, meant", [
    ("shakespeare-2.6m", "shakespeare-2.6M"), ("Shakespeare-260k", "shakespeare-260K"), ("gpt2-meduim", "gpt2-medium"),
    ("gpt-2", "gpt2"), ("distilgpt-2", "distilgpt2"), ("1558m", "1558M"),
])
def test_a_near_miss_gets_did_you_mean(tmp_path, no_network, monkeypatch, name, meant):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as info:
        gpt2np.load_model(name, tmp_path)
    assert str(info.value).startswith(f"unknown model {name!r} (did you mean {meant}?): use one of "), info.value


def test_a_far_miss_gets_no_guess_and_drafter_names_only_as_a_drafter(tmp_path, no_network, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("llama-7b", "ngarm", "none"):  # as a target, ngram and none are no models
        with pytest.raises(ValueError) as info:
            gpt2np.load_model(name, tmp_path)
        assert "did you mean" not in str(info.value) and "ngram" not in str(info.value), info.value
    drafter = str(loading.unknown_model("ngarm", drafter=True))
    assert "(did you mean ngram?)" in drafter and drafter.endswith(
        "a model folder, ngram (prompt lookup, no model), or none (no drafter: the target alone)")
