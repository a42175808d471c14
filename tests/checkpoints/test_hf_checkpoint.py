"""Hugging Face layout folders (gpt2np/checkpoints/hf_layout.py): logits against transformers' own, the
vocab.json/merges.txt tokenizer, identical parameters from both layouts, the Hub cache layout,
and one-line refusals of what gpt2np cannot run.

The fixtures tests/fixtures/hf-tiny-* were written by transformers' save_pretrained, with
reference logits computed by transformers (tools/make_hf_fixtures.py); no torch here.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import gpt2np
from gpt2np.checkpoints import weights
from gpt2np.checkpoints.tf_writer import write_checkpoint
from gpt2np.model.config import GPT2Config
from gpt2np.checkpoints.hf_layout import config_from_hf, load_hf_params, read_hf_config
from gpt2np.checkpoints.safetensors import read_header, read_safetensors, write_safetensors
from gpt2np.tokenizer.files import load_hf_tokenizer, load_tokenizer
from conftest import FIXTURES, REPO, copy_fixture
from test_weights import assert_same_bits

HF_FIXTURES = ("hf-tiny-f32", "hf-tiny-f16", "hf-tiny-noprefix")
# Measured max |ours - HF| over 58 positions x 267 logits (|logits| up to 3.7), float32 both sides:
# f32 1.8e-6, f16 (its float16 weights run in float32) 1.8e-6, noprefix 1.7e-6. 1e-5 is the bar.
ATOL = 1e-5
# f16 against transformers running the same float16 weights IN float16 on the CPU: measured 4.3e-3.
# float16 keeps 11 significant bits (relative step 2^-11 = 4.9e-4); every activation is rounded to
# that after each of the ~20 operations of two blocks, and logits of size ~3 then carry a few 1e-3.
# gpt2np computes in float32 (the weights are converted at load), so it is the more accurate side.
ATOL_NATIVE_F16 = 1.5e-2


@pytest.fixture
def folder(tmp_path):
    """f(name) -> a private copy of tests/fixtures/<name> (loading writes a cache into the folder)."""
    def copy(name):
        return copy_fixture(FIXTURES / name, tmp_path / name)
    return copy


def reference(name):
    return np.load(FIXTURES / name / "reference.npz")


def all_logits(model, ids):
    return model.forward(ids, model.new_cache(), n_logits=len(ids))  # [n_seq, n_vocab]


@pytest.mark.parametrize("name", HF_FIXTURES)
def test_logits_match_transformers_and_greedy_tokens_agree(folder, name):
    ref = reference(name)
    model = gpt2np.load_model(folder(name))
    ids = model.tokenizer.encode(str(ref["text"]))
    assert ids == ref["tokens"].tolist()
    logits = all_logits(model, ids)
    np.testing.assert_allclose(logits, ref["logits"], atol=ATOL, rtol=0)
    np.testing.assert_array_equal(logits.argmax(-1), ref["logits"].argmax(-1))


def test_float16_against_transformers_computing_in_float16(folder, capsys):
    ref = reference("hf-tiny-f16")
    model = gpt2np.load_model(folder("hf-tiny-f16"))
    assert "stores float16 weights; converted to float32 at load" in capsys.readouterr().err
    assert model.params["wte"].dtype == np.float32
    diff = np.abs(all_logits(model, ref["tokens"].tolist()) - ref["logits_native"]).max()
    assert 1e-4 < diff < ATOL_NATIVE_F16, diff  # float16 arithmetic really is coarser, and by this much


@pytest.mark.parametrize("name", HF_FIXTURES)
@pytest.mark.parametrize("fast", [True, False])
def test_tokenizer_encodes_as_transformers_gpt2tokenizer(name, fast):
    ref, tok = reference(name), load_hf_tokenizer(FIXTURES / name, fast=fast)
    for i in range(5):
        assert tok.encode(str(ref[f"text_{i}"])) == ref[f"texts_{i}"].tolist(), str(ref[f"text_{i}"])
        assert tok.decode(ref[f"texts_{i}"].tolist()) == str(ref[f"text_{i}"])


@pytest.mark.parametrize("fast", [True, False])
def test_vocab_json_and_merges_txt_are_encoder_json_and_vocab_bpe_renamed(tmp_path, fast):
    """The same files under OpenAI's names give the same Tokenizer: same vocabulary, same merges, same ids."""
    shutil.copy(FIXTURES / "hf-tiny-f32" / "vocab.json", tmp_path / "encoder.json")
    shutil.copy(FIXTURES / "hf-tiny-f32" / "merges.txt", tmp_path / "vocab.bpe")
    hf, openai = load_hf_tokenizer(FIXTURES / "hf-tiny-f32", fast), load_tokenizer(tmp_path, fast)
    assert type(hf) is type(openai) and hf.encoder == openai.encoder and hf.ranks == openai.ranks
    text = str(reference("hf-tiny-f32")["text"])
    assert hf.encode(text) == openai.encode(text) and hf.eot_id == openai.eot_id == 266


def test_openai_tokenizer_files_as_vocab_json_and_merges_txt(bpe_dir, tmp_path):
    shutil.copy(bpe_dir / "encoder.json", tmp_path / "vocab.json")
    shutil.copy(bpe_dir / "vocab.bpe", tmp_path / "merges.txt")
    text = "Hello, world! Alan Turing theorized that<|endoftext|>"
    assert load_hf_tokenizer(tmp_path).encode(text) == load_tokenizer(bpe_dir).encode(text)
    assert load_hf_tokenizer(tmp_path).encode("Hello, world!") == [15496, 11, 995, 0]


# ---- the same weights in both layouts -------------------------------------------------------------

def test_hf_folder_saved_as_tf_checkpoint_loads_identical_params(folder, tmp_path):
    hf_dir = folder("hf-tiny-f32")
    config = read_hf_config(hf_dir)
    hf_params = load_hf_params(hf_dir, config)
    tf_dir = tmp_path / "tf"
    tf_dir.mkdir()
    write_checkpoint(str(tf_dir / "model.ckpt"), weights.params_to_tf(hf_params))
    (tf_dir / "hparams.json").write_text(json.dumps(config.__dict__))
    assert_same_bits(weights.load_params(tf_dir, config), hf_params)


def hf_tensors(params, prefix="transformer."):
    """params -> HF names: the inverse of the loader's table, written out independently here."""
    tensors = {prefix + "wte.weight": params["wte"], prefix + "wpe.weight": params["wpe"],
               prefix + "ln_f.weight": params["ln_f"]["g"], prefix + "ln_f.bias": params["ln_f"]["b"]}
    for i, block in enumerate(params["blocks"]):
        for path in ("ln_1", "ln_2", "attn/c_attn", "attn/c_proj", "mlp/c_fc", "mlp/c_proj"):
            node = block
            for key in path.split("/"):
                node = node[key]
            name = f"{prefix}h.{i}.{path.replace('/', '.')}"
            for ours, theirs in (("g", "weight"), ("b", "bias"), ("w", "weight")):
                if ours in node:
                    tensors[f"{name}.{theirs}"] = node[ours]
    return tensors


def write_hf_folder(path, params, config, extra=None, **config_changes):
    path.mkdir(parents=True, exist_ok=True)
    hf_config = {"model_type": "gpt2", "activation_function": "gelu_new", "vocab_size": config.n_vocab,
                 "n_positions": config.n_ctx, "n_embd": config.n_embd, "n_head": config.n_head,
                 "n_layer": config.n_layer, "layer_norm_epsilon": 1e-5, "n_inner": None} | config_changes
    (path / "config.json").write_text(json.dumps(hf_config))
    write_safetensors(path / "model.safetensors", hf_tensors(params) | (extra or {}))
    return path


def test_openai_checkpoint_saved_in_hf_layout_loads_identical_params_and_hf_logits(tmp_path):
    """gpt2-tiny-a was written by real TensorFlow; its reference.npz holds transformers' logits."""
    config = GPT2Config.from_hparams_json(FIXTURES / "gpt2-tiny-a" / "hparams.json")
    copy_fixture(FIXTURES / "gpt2-tiny-a", tmp_path / "tf")
    tf_params = weights.load_params(tmp_path / "tf", config)
    hf_dir = write_hf_folder(tmp_path / "hf", tf_params, config)
    hf_params = load_hf_params(hf_dir, read_hf_config(hf_dir))
    assert_same_bits(hf_params, tf_params)
    ref = np.load(FIXTURES / "gpt2-tiny-a" / "reference.npz")
    logits = all_logits(gpt2np.GPT2(config, hf_params), ref["tokens"])
    np.testing.assert_allclose(logits, ref["logits"], atol=ATOL, rtol=0)


# ---- names, lm_head, buffers, cache ---------------------------------------------------------------

@pytest.fixture
def tiny(tmp_path):
    """(params, config) of hf-tiny-f32, and a writer of variants of it."""
    config = read_hf_config(FIXTURES / "hf-tiny-f32")
    params = load_hf_params(copy_fixture(FIXTURES / "hf-tiny-f32", tmp_path / "orig"), config)
    return params, config


def test_tied_lm_head_copy_and_old_buffers_load(tiny, tmp_path):
    params, config = tiny
    buffers = {"transformer.h.0.attn.bias": np.tril(np.ones((1, 1, 64, 64), np.uint8)),
               "transformer.h.1.attn.masked_bias": np.array(-1e4, np.float32),
               "lm_head.weight": params["wte"]}
    loaded = load_hf_params(write_hf_folder(tmp_path / "m", params, config, buffers), config)
    assert_same_bits(loaded, params)


def test_untied_lm_head_is_refused(tiny, tmp_path):
    params, config = tiny
    head = params["wte"] + np.float32(0.5)
    with pytest.raises(ValueError, match=r"lm_head.weight differs from wte \(max \|diff\| 0.5"):
        load_hf_params(write_hf_folder(tmp_path / "m", params, config, {"lm_head.weight": head}), config)


@pytest.mark.parametrize("change, words", [
    (lambda t: t.pop("transformer.h.1.mlp.c_fc.weight"), "missing 1: transformer.h.1.mlp.c_fc.weight"),
    (lambda t: t.update({"score.weight": np.zeros((2, 32), np.float32)}), "unexpected 1: score.weight"),
    (lambda t: t.update({"transformer.h.0.ln_1.weight": np.ones(31, np.float32)}),
     "model/h0/ln_1/g is (31,) not (32,)"),
])
def test_wrong_names_and_shapes_are_one_line_errors(tiny, tmp_path, change, words):
    params, config = tiny
    tensors = hf_tensors(params)
    change(tensors)
    (tmp_path / "m").mkdir()
    write_safetensors(tmp_path / "m" / "model.safetensors", tensors)
    with pytest.raises(ValueError) as e:
        load_hf_params(tmp_path / "m", config)
    assert words in str(e.value) and "\n" not in str(e.value) and "model.safetensors" in str(e.value)


def test_second_load_reads_the_cache_and_a_changed_file_rebuilds_it(folder, monkeypatch):
    path = folder("hf-tiny-f32")
    config = read_hf_config(path)
    first = load_hf_params(path, config)
    assert (path / weights.CACHE_DIR / "manifest.json").is_file()
    import gpt2np.checkpoints.hf_layout as hf
    monkeypatch.setattr(hf, "read_hf_tensors", lambda *a: pytest.fail("cache not used"))
    assert_same_bits(load_hf_params(path, config), first)
    monkeypatch.undo()
    tensors = read_safetensors(path / "model.safetensors")
    changed = {k: np.array(x) for k, x in tensors.items()}
    changed["transformer.ln_f.bias"] += np.float32(1)
    del tensors
    write_safetensors(path / "model.safetensors", changed)
    np.testing.assert_array_equal(load_hf_params(path, config)["ln_f"]["b"], first["ln_f"]["b"] + 1)


def test_data_rewritten_in_place_with_the_old_mtime_is_not_served_from_the_cache(folder):
    """The audit's repro: every weight halved in place, header kept (same size, same header hash), and
    the mtime put back as cp -p, rsync -a or tar do. The ctime (which no tool can set) tells."""
    path = folder("hf-tiny-f32")
    config = read_hf_config(path)
    first = load_hf_params(path, config)
    file = path / "model.safetensors"
    old = file.stat()
    _, start, data_size = read_header(file)
    time.sleep(0.05)  # past the coarse clock tick (a few ms) that stamps ctime on some kernels
    with open(file, "r+b") as f:  # the same inode, rewritten in place
        f.seek(start)
        data = np.frombuffer(f.read(data_size), np.float32) / np.float32(2)
        f.seek(start)
        f.write(data.tobytes())
    os.utime(file, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert file.stat().st_mtime_ns == old.st_mtime_ns and file.stat().st_size == old.st_size
    second = load_hf_params(path, config)
    np.testing.assert_array_equal(second["wte"], first["wte"] / 2)
    np.testing.assert_array_equal(second["ln_f"]["g"], first["ln_f"]["g"] / 2)


# ---- the Hub cache layout -------------------------------------------------------------------------

def hub_cache(tmp_path, name="hf-tiny-f32", revision="0123abcd"):
    """models--owner--name/ as huggingface_hub writes it: blobs/<hash> files, snapshots/<rev>/
    symlinks to them, refs/main holding the revision."""
    repo = tmp_path / "hub" / "models--owner--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / revision).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    for n, file in enumerate(sorted(p for p in (FIXTURES / name).iterdir() if p.is_file())):
        shutil.copy(file, repo / "blobs" / f"blob{n}")
        (repo / "snapshots" / revision / file.name).symlink_to(f"../../blobs/blob{n}")
    return repo


@pytest.mark.parametrize("which", ["snapshot", "repo folder"])
def test_hub_cache_folder_loads_directly(tmp_path, which):
    repo = hub_cache(tmp_path)
    path = repo / "snapshots" / "0123abcd" if which == "snapshot" else repo
    ref = reference("hf-tiny-f32")
    model = gpt2np.load_model(str(path))
    np.testing.assert_allclose(all_logits(model, ref["tokens"].tolist()), ref["logits"], atol=ATOL, rtol=0)
    assert all(p.is_symlink() for p in (repo / "snapshots" / "0123abcd").glob("*.json"))  # left as they were


@pytest.mark.parametrize("ref, words", [
    ("fedcba98", "refs/main names snapshot 'fedcba98', which is missing from {snapshots} (the snapshots there: "
                 "0123abcd)"),
    ("", "refs/main is empty: it should name the snapshot to load (the snapshots there: 0123abcd;"),
    ("\n", "refs/main is empty"),
    ("../../hub", "refs/main holds '../../hub', not a snapshot name"),
])
def test_hub_cache_folder_whose_refs_main_names_no_snapshot_says_so(tmp_path, ref, words):
    repo = hub_cache(tmp_path)
    (repo / "refs" / "main").write_text(ref)
    with pytest.raises(FileNotFoundError) as e:
        gpt2np.load_model(str(repo))
    message = str(e.value)
    assert words.format(snapshots=repo / "snapshots") in message and "\n" not in message, message
    assert str(repo / "refs" / "main") in message


# ---- refusals -------------------------------------------------------------------------------------

GOOD = json.loads((FIXTURES / "hf-tiny-f32" / "config.json").read_text())


@pytest.mark.parametrize("changes, words", [
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "model_type 'llama' (architectures "
                                                                     "['LlamaForCausalLM']) is not GPT-2"),
    ({"model_type": "gpt_neox"}, "model_type 'gpt_neox'"),
    ({"activation_function": "gelu"}, "activation_function 'gelu' is not GPT-2's tanh GELU"),
    ({"activation_function": "relu"}, "activation_function 'relu'"),
    ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon = 1e-06"),
    ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx = True"),
    ({"n_inner": 100}, "n_inner = 100"),
    ({"n_layer": None, "n_head": None}, "lacks n_head, n_layer"),  # None: the key is left out
    ({"n_embd": 30}, "n_embd (30) must be divisible by n_head (4)"),
])
def test_config_json_refusals_are_one_line(tmp_path, changes, words):
    bad = {k: v for k, v in (GOOD | changes).items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError) as e:
        read_hf_config(tmp_path)
    assert words in str(e.value) and "\n" not in str(e.value) and "config.json" in str(e.value), str(e.value)


@pytest.mark.parametrize("text, words", [
    ("[1, 2]", "config.json must be a JSON object (model_type, n_embd, n_layer, ...), got a JSON list"),
    ('"gpt2"', "got a JSON str"),
    (json.dumps(GOOD)[:40], "config.json is not valid JSON (Unterminated string"),  # a download cut short
    (b"\xff{}", "config.json is not valid JSON ("),
])
def test_config_json_that_is_no_json_object_is_one_line(tmp_path, text, words):
    """A list said "'list' object has no attribute 'get'"; a cut file must say what to do about it."""
    (tmp_path / "config.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError) as e:
        read_hf_config(tmp_path)
    message = str(e.value)
    assert words in message and "\n" not in message and message.startswith(str(tmp_path / "config.json")), message
    assert ("delete it and download it again" in message) == ("not valid JSON" in words)


def test_hf_folder_without_config_json_is_told_it_misses_config_json(folder):
    """model.safetensors + vocab.json + merges.txt is a Hugging Face folder lacking config.json, not an
    OpenAI one lacking hparams.json and model.ckpt.*: the error names the layout it is closest to."""
    path = folder("hf-tiny-f32")
    (path / "config.json").unlink()
    with pytest.raises(FileNotFoundError) as e:
        gpt2np.load_model(str(path))
    message = str(e.value)
    assert f"{path} is not a model folder: missing config.json (" in message and "\n" not in message, message
    assert "hparams.json" not in message and "model.ckpt" not in message, message


def test_release_folders_and_empty_ones_are_still_told_the_release_files(tmp_path):
    release = copy_fixture(FIXTURES / "gpt2-tiny-a", tmp_path / "a")
    (release / "model.ckpt.index").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing model\.ckpt\.index \(OpenAI's release layout: "):
        gpt2np.load_model(str(release))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"missing hparams\.json, .* or config\.json, .* Hugging Face"):
        gpt2np.load_model(str(tmp_path / "empty"))


@pytest.mark.parametrize("changes", [{"n_embd": 64}, {"n_layer": 3}])
def test_config_json_of_another_size_is_named_in_the_hint(folder, changes):
    path = folder("hf-tiny-f32")
    (path / "config.json").write_text(json.dumps(GOOD | changes))
    with pytest.raises(ValueError) as e:
        gpt2np.load_model(str(path))
    message = str(e.value)
    assert "model.safetensors does not fit" in message and "does config.json belong to this checkpoint?" in message
    assert "hparams.json" not in message and "\n" not in message, message


def test_gelu_pytorch_tanh_is_the_same_function_and_accepted():
    assert config_from_hf(GOOD | {"activation_function": "gelu_pytorch_tanh"}) == config_from_hf(GOOD)


def test_cli_runs_hf_folders_and_refuses_another_architecture_in_one_line(tmp_path):
    run = [sys.executable, "main.py", "--n_tokens_to_generate", "6", "--prompt", "the weather"]
    for name in HF_FIXTURES[:2]:
        copy_fixture(FIXTURES / name, tmp_path / name)
    out = subprocess.run(run + ["--target_model_size", str(tmp_path / "hf-tiny-f32"), "--draft_model_size",
                                str(tmp_path / "hf-tiny-f16")], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "speculative" in out.stdout and "float16" in out.stderr
    (tmp_path / "hf-tiny-f32" / "config.json").write_text(json.dumps(GOOD | {"model_type": "bert"}))
    out = subprocess.run(run + ["--target_model_size", str(tmp_path / "hf-tiny-f32")],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "model_type 'bert'" in out.stderr, out.stderr


def test_cli_hf_name_drafts_for_a_release_folder_when_its_files_are_present(bpe_dir, tmp_path):
    """README's `--draft_model_size hf:distilbert/distilgpt2 --target_model_size 355M`, in miniature:
    the draft is gpt2-tiny-b in the HF layout under models_dir/owner/draft/ (OpenAI's tokenizer files
    as vocab.json + merges.txt), the target gpt2-tiny-a in OpenAI's; an unreachable endpoint proves
    that nothing is fetched."""
    target = copy_fixture(FIXTURES / "gpt2-tiny-a", tmp_path / "target")
    config = GPT2Config.from_hparams_json(FIXTURES / "gpt2-tiny-b" / "hparams.json")
    params = weights.load_params(copy_fixture(FIXTURES / "gpt2-tiny-b", tmp_path / "b"), config)
    draft = write_hf_folder(tmp_path / "models" / "owner" / "draft", params, config)
    for openai, hf in (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")):
        shutil.copy(bpe_dir / openai, target / openai)
        shutil.copy(bpe_dir / openai, draft / hf)
    out = subprocess.run([sys.executable, "main.py", "--draft_model_size", "hf:owner/draft", "--target_model_size",
                          str(target), "--models_dir", str(tmp_path / "models"), "--hf_endpoint", "http://127.0.0.1:9",
                          "--n_tokens_to_generate", "8", "--prompt", "Alan Turing theorized that"],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "drafter: hf:owner/draft" in out.stdout and "speculative (drafter hf:owner/draft, K=4)" in out.stdout
