"""What the server shows of its machine, and the flags it names.

Models loaded from a folder are listed, selected and reported by the folder's name: no answer, error
or statistic sent over HTTP holds a local path. The command line takes main.py's loading flags
(--models_dir, --mirror, --hf_endpoint), its --help names hf: models and folders, and its loading
errors name its own flags. Downloads go to a local imitation of the Hub (tests/http_fixture_server.py)
or to a closed port on 127.0.0.1: never the internet.
"""
import json
import re
import shutil
import socket
import subprocess
import sys

import pytest

pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install -r requirements-serve.txt)")
import requests  # noqa: E402

from gpt2np.serve.__main__ import load_engine, parse_args, run  # noqa: E402
from gpt2np.serve.names import served_name, without_paths  # noqa: E402
from conftest import FIXTURES, copy_fixture  # noqa: E402
from http_fixture_server import FixtureServer  # noqa: E402
from serve_helpers import DRAFT, TARGET, running_server  # noqa: E402

BUNDLED = FIXTURES.parents[1] / "gpt2np" / "bundled"
FLAGS = set(parse_args([]).__dict__)  # the server's own flags, without the dashes


def copy_bundled(name, to):
    return shutil.copytree(BUNDLED / name, to)


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return root, copy_bundled(TARGET, root / "my-target"), copy_bundled(DRAFT, root / "my-draft")


@pytest.fixture(scope="module")
def folder_server(folders):
    root, target, draft = folders
    engine = load_engine(parse_args(["--target_model_size", str(target), "--draft_model_size", str(draft)]))
    with running_server(engine) as url:
        yield url, str(root.resolve())


def test_models_from_folders_are_served_by_their_names(folder_server):
    url, root = folder_server
    models = requests.get(url + "/v1/models", timeout=10)
    model = models.json()["data"][0]
    assert model["id"] == "my-target" and model["gpt2np"]["drafters"] == ["my-draft", "ngram"], model
    assert root not in models.text and root not in requests.get(url + "/health", timeout=10).text


@pytest.mark.parametrize("stream", [False, True])
def test_answers_and_statistics_hold_no_path(folder_server, stream):
    url, root = folder_server
    body = {"model": "my-target", "prompt": "ROMEO:", "max_tokens": 12, "temperature": 0, "drafter": "my-draft",
            "stream": stream}
    answer = requests.post(url + "/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200 and root not in answer.text, answer.text[:300]
    last = json.loads(answer.text.split("data: ")[-2]) if stream else answer.json()
    assert last["model"] == "my-target" and last["gpt2np"]["stats"]["drafter"] == "my-draft", last["gpt2np"]


@pytest.mark.parametrize("field, value, status", [
    ("drafter", "{root}/my-draft", 400), ("model", "{root}/my-target", 404), ("drafter", "{root}", 400)])
def test_errors_over_http_hold_no_path(folder_server, field, value, status):
    url, root = folder_server
    body = {"model": "my-target", "prompt": "ROMEO:", "max_tokens": 4, field: value.format(root=root)}
    answer = requests.post(url + "/v1/completions", json=body, timeout=60)
    assert answer.status_code == status and answer.json()["error"]["param"] == field, answer.text
    assert root not in answer.text, f"the error shows the path: {answer.json()['error']['message']}"


def test_without_paths_cuts_local_paths_only(tmp_path):
    folder = tmp_path / "weights" / "124M"
    shown = without_paths(f"{folder} is not a model folder (see GET /v1/models or http://127.0.0.1:8000/docs)")
    assert shown == "…/124M is not a model folder (see GET /v1/models or http://127.0.0.1:8000/docs)", shown
    assert without_paths("'C:\\Users\\me\\weights\\124M': missing hparams.json") == "'…/124M': missing hparams.json"
    assert without_paths("../weights/124M and /v1/completions stay") == "../weights/124M and /v1/completions stay"


def test_a_folder_in_the_hubs_cache_is_served_as_owner_and_name(tmp_path):
    snapshot = tmp_path / "models--owner--tiny" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (tmp_path / "x").mkdir()
    assert (served_name(snapshot), served_name(snapshot.parents[1]), served_name(tmp_path / "x" / "..")) == \
           ("owner/tiny", "owner/tiny", tmp_path.name)


def test_a_draft_folder_named_ngram_is_refused(folders, tmp_path):
    _, target, draft = folders
    ngram = shutil.copytree(draft, tmp_path / "ngram")
    with pytest.raises(ValueError, match="--draft_model_size"):
        load_engine(parse_args(["--target_model_size", str(target), "--draft_model_size", str(ngram)]))


def test_help_names_hub_models_folders_and_the_loading_flags():
    shown = subprocess.run([sys.executable, "-m", "gpt2np.serve", "--help"], capture_output=True, text=True,
                           timeout=60)
    text = " ".join(shown.stdout.split())
    assert shown.returncode == 0 and "hf:owner/name" in text and "folder" in text, shown.stdout
    assert {"--models_dir", "--mirror", "--hf_endpoint"} <= set(re.findall(r"--\w+", text))


def test_hf_endpoint_and_models_dir_reach_the_loader(tmp_path):
    copy_fixture(FIXTURES / "hf-tiny-f32", tmp_path / "hub" / "owner" / "tiny" / "resolve" / "main")
    with FixtureServer(tmp_path / "hub") as hub:
        args = parse_args(["--target_model_size", "hf:owner/tiny", "--draft_model_size", "none",
                           "--hf_endpoint", hub.url, "--models_dir", str(tmp_path / "models")])
        engine = load_engine(args)
        asked = [path for path, _ in hub.requests]
    assert "/owner/tiny/resolve/main/config.json" in asked, asked
    assert (tmp_path / "models" / "owner" / "tiny" / "model.safetensors").is_file()
    assert engine.model_id == "hf:owner/tiny" and list(engine.drafters) == ["ngram"]


@pytest.mark.parametrize("model, flag", [("hf:owner/tiny", "--hf_endpoint"), ("124M", "--mirror")])
def test_an_offline_download_error_names_this_commands_flags(tmp_path, capsys, model, flag):
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(SystemExit) as ended:
        run(["--target_model_size", model, "--models_dir", str(tmp_path), flag, url])
    message = capsys.readouterr().err.strip()
    assert ended.value.code == 2 and len(message.splitlines()) == 1, message
    named = set(re.findall(r"--(\w+)", message))
    assert flag[2:] in named and named <= FLAGS, f"flags {named - FLAGS} do not exist: {message}"
    assert url in message and "base_url" not in message, message
