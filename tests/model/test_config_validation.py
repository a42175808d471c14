"""Hostile hparams.json (issue 16, item 3): refused in one line, exit status 2, before any allocation.

hparams.json comes from whoever serves the files; before gpt2np.model.config.LIMITS, "n_layer":
99999999999 grew the checkpoint name table to 16 GB, and null or "12" died with a traceback.
"""
import json
import re
import subprocess
import sys
import tracemalloc

import pytest

import gpt2np
from conftest import FIXTURES, REPO, copy_fixture
from gpt2np.model.config import LIMITS, PRESETS, GPT2Config

GOOD = {"n_vocab": 50257, "n_ctx": 64, "n_embd": 32, "n_head": 2, "n_layer": 2}  # tests/fixtures/gpt2-tiny-a
HOSTILE = [  # (hparams.json text, part of the one-line error)
    pytest.param(json.dumps(GOOD | {"n_layer": 99999999999}), "n_layer must be at most 1,024", id="huge-layers"),
    pytest.param(json.dumps(GOOD | {"n_embd": 10**9, "n_head": 1}), "n_embd must be at most", id="huge-width"),
    pytest.param(json.dumps(GOOD | {"n_vocab": 2**40}), "n_vocab must be at most", id="huge-vocab"),
    pytest.param(json.dumps(GOOD | {"n_ctx": 10**7}), "n_ctx must be at most", id="huge-context"),
    pytest.param(json.dumps(GOOD | {"n_head": 4096, "n_embd": 4096}), "n_head must be at most", id="huge-heads"),
    pytest.param(json.dumps(GOOD | {"n_layer": None}), "positive integer, got None", id="null"),
    pytest.param(json.dumps(GOOD | {"n_layer": -2}), "positive integer, got -2", id="negative"),
    pytest.param(json.dumps(GOOD | {"n_layer": 0}), "positive integer, got 0", id="zero"),
    pytest.param(json.dumps(GOOD | {"n_layer": 2.5}), "positive integer, got 2.5", id="fraction"),
    pytest.param(json.dumps(GOOD | {"n_layer": 2.0}), "positive integer, got 2.0", id="float"),
    pytest.param(json.dumps(GOOD | {"n_layer": "2"}), "positive integer, got '2'", id="string"),
    pytest.param(json.dumps(GOOD | {"n_layer": True}), "positive integer, got True", id="bool"),
    pytest.param(json.dumps(GOOD | {"n_layer": [2]}), "positive integer, got [2]", id="list"),
    pytest.param(json.dumps(GOOD).replace("2}", "1e999}"), "positive integer, got inf", id="infinity"),
    pytest.param(json.dumps(GOOD | {"n_head": 3}), "divisible by n_head (3)", id="heads-not-dividing"),
    pytest.param(json.dumps(GOOD | {"n_layers": 2}), "exactly the keys", id="extra-key"),
    pytest.param('[50257, 64, 32, 2, 2]', "must be a JSON object", id="array"),
    pytest.param('12', "must be a JSON object", id="number"),
    pytest.param('{"n_vocab": 50257,', "not valid JSON", id="cut"),
    pytest.param(json.dumps(GOOD | {"n_ctx": 0}).replace('"n_ctx": 0', '"n_ctx": 1' + "0" * 5000),
                 "Exceeds the limit", id="5000-digit-int"),
    pytest.param(" " * 70_000 + json.dumps(GOOD), "larger than 65,536 bytes", id="huge-file"),
]


def hostile_folder(tmp_path, text):
    folder = tmp_path / "hostile"
    copy_fixture(FIXTURES / "gpt2-tiny-a", folder, ignore=["reference.npz"])
    (folder / "hparams.json").write_text(text)
    return folder


@pytest.mark.parametrize("text, message", HOSTILE)
def test_hostile_hparams_refused_in_one_line_before_any_allocation(tmp_path, text, message):
    folder = hostile_folder(tmp_path, text)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=re.escape(message)) as info:
            gpt2np.load_model(folder)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    line = str(info.value)
    assert "\n" not in line and "hparams.json" in line and len(line) < 300, line
    assert peak < 2**20, f"allocated {peak:,} bytes before refusing"  # the file is read, nothing sized from it
    assert not (folder / ".gpt2np-cache").exists()


@pytest.mark.parametrize("text, message", [HOSTILE[0], HOSTILE[5]])
def test_main_exits_2_with_one_line(tmp_path, text, message):
    folder = hostile_folder(tmp_path, text)
    out = subprocess.run([sys.executable, "main.py", "--target_model_size", str(folder)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_limits_admit_every_release_size_and_their_edges():
    for config in PRESETS.values():
        GPT2Config(**{name: getattr(config, name) for name in LIMITS})
    largest = GPT2Config(**LIMITS)  # n_embd 32768 is divisible by n_head 1024
    assert largest.n_layer == 1024
    with pytest.raises(ValueError, match="n_layer must be at most 1,024, got 1,025"):
        GPT2Config(**(LIMITS | {"n_layer": 1025}))
