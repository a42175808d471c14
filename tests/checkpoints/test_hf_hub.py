"""hf:owner/name[@revision] (gpt2np/checkpoints/hub.py) against a Hub imitation on 127.0.0.1, never the internet.

The imitation serves <root>/<repo>/resolve/<revision>/<file> like the Hub: a HEAD of an LFS file
(model.safetensors) answers 302 towards a CDN with the sha256 in X-Linked-Etag and the size in
X-Linked-Size, small files answer 200 with a git-sha1 ETag and their Content-Length; a renamed
repository answers 307 to its new name. Downloads then go through download.py's fetch_file
(tests/http_fixture_server.py does Range and the faults; its own handler has no HEAD, as a plain mirror).
"""
import hashlib
import json

import numpy as np
import pytest

import gpt2np
from gpt2np.checkpoints import hub
from gpt2np.checkpoints.download import DownloadError
from gpt2np.checkpoints.hub import HUB_FILES, download_hub_model, parse_hub_name
from gpt2np.checkpoints.safetensors import read_safetensors, write_safetensors
from conftest import FIXTURES, copy_fixture
from http_fixture_server import FixtureServer, _Handler

FIXTURE = FIXTURES / "hf-tiny-f32"
LFS = "model.safetensors"
LONG_CTX = 16384


class HubHandler(_Handler):
    def _record(self):
        fixture = self.server.fixture
        fixture.seen.append((self.command, self.path, self.headers.get("Authorization")))
        old = next((o for o in fixture.renamed if self.path.startswith(f"/{o}/")), None)
        if old:  # the Hub answers a renamed repository with a relative redirect to its new name
            self.send_response(307)
            self.send_header("Location", self.path.replace(old, fixture.renamed[old], 1))
            self.send_header("Content-Length", "0")
            self.end_headers()
        return old

    def do_GET(self):
        if not self._record():
            super().do_GET()

    def do_HEAD(self):
        if self._record():
            return
        fixture = self.server.fixture
        path = (fixture.root / self.path.lstrip("/")).resolve()
        if not path.is_relative_to(fixture.root) or not path.is_file():
            self.send_response(404)
        elif path.name == LFS:
            self.send_response(302)
            sha = fixture.wrong_sha256 or hashlib.sha256(path.read_bytes()).hexdigest()
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(path.stat().st_size))
            self.send_header("Location", f"https://cdn.invalid/{sha}")  # another host: not followed
        else:  # a HEAD's Content-Length is the GET's: the file's size
            self.send_response(200)
            self.send_header("ETag", f'"{hashlib.sha1(path.read_bytes()).hexdigest()}"')
            self.send_header("Content-Length", str(path.stat().st_size))
            self.end_headers()
            return
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    """owner/tiny: hf-tiny-f32 at revisions main and v1; owner/long: the same with n_positions 16384,
    whose 2.2 MB file is long enough to be cut after download.py's first 1 MiB chunk is written."""
    root = tmp_path_factory.mktemp("hub")
    for revision in ("main", "v1"):
        copy_fixture(FIXTURE, root / "owner" / "tiny" / "resolve" / revision)
    long = copy_fixture(FIXTURE, root / "owner" / "long" / "resolve" / "main")
    config = json.loads((FIXTURE / "config.json").read_text()) | {"n_positions": LONG_CTX}
    (long / "config.json").write_text(json.dumps(config))
    tensors = dict(read_safetensors(FIXTURE / LFS))
    tensors["transformer.wpe.weight"] = np.random.default_rng(0).standard_normal((LONG_CTX, 32), np.float32)
    write_safetensors(long / LFS, tensors)
    return root


@pytest.fixture
def server(hub_root):
    with FixtureServer(hub_root, handler=HubHandler) as s:
        s.seen, s.renamed, s.wrong_sha256 = [], {}, None
        yield s


def gets(server, name=None):
    return [path for method, path, _ in server.seen if method == "GET" and (name is None or path.endswith(name))]


@pytest.fixture(autouse=True)
def no_hub_environment(monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)


def test_download_loads_the_model_and_a_second_load_asks_nothing(server, tmp_path):
    model = gpt2np.load_model("hf:owner/tiny", tmp_path, hf_endpoint=server.url)
    folder = tmp_path / "owner" / "tiny"
    for name in HUB_FILES:
        assert (folder / name).read_bytes() == (FIXTURE / name).read_bytes(), name
    assert not list(folder.glob("*.part"))
    assert sorted(gets(server)) == sorted(f"/owner/tiny/resolve/main/{f}" for f in HUB_FILES)
    ref = np.load(FIXTURE / "reference.npz")
    logits = model.forward(ref["tokens"], model.new_cache(), n_logits=len(ref["tokens"]))
    np.testing.assert_allclose(logits, ref["logits"], atol=1e-5, rtol=0)  # see test_hf_checkpoint.py
    n = len(server.seen)
    gpt2np.load_model("hf:owner/tiny", tmp_path, hf_endpoint=server.url)
    assert len(server.seen) == n


def test_a_hub_download_holds_its_folders_lock_and_skips_what_another_finished(server, tmp_path, monkeypatch):
    """download.py's rule 7 for hf: names too: the folder's lock is held while it downloads, and once it has it
    the files another download completed meanwhile are not fetched again."""
    from contextlib import contextmanager
    from gpt2np.checkpoints import download
    folder, locked = tmp_path / "owner" / "tiny", []

    @contextmanager
    def lock(where, progress=True):  # as if another process finished the first file while this one waited
        locked.append(where)
        (where / HUB_FILES[0]).write_bytes((FIXTURE / HUB_FILES[0]).read_bytes())
        yield
    monkeypatch.setattr(download, "folder_lock", lock)
    gpt2np.load_model("hf:owner/tiny", tmp_path, hf_endpoint=server.url)
    assert locked == [folder]
    assert sorted(gets(server)) == sorted(f"/owner/tiny/resolve/main/{f}" for f in HUB_FILES[1:])


def test_revision_goes_into_the_url_and_its_own_folder(server, tmp_path):
    folder = download_hub_model("hf:owner/tiny@v1", tmp_path, server.url, progress=False)
    assert folder == tmp_path / "owner" / "tiny@v1" and (folder / LFS).is_file()
    assert all("/resolve/v1/" in path for path in gets(server))


def test_token_is_sent_as_bearer_and_endpoint_comes_from_hf_endpoint(server, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    download_hub_model("hf:owner/tiny", tmp_path, progress=False)
    assert server.seen and {auth for _, _, auth in server.seen} == {"Bearer hf_secret"}


def test_no_token_no_authorization_header(server, tmp_path):
    download_hub_model("hf:owner/tiny", tmp_path, server.url, progress=False)
    assert {auth for _, _, auth in server.seen} == {None}


def test_flag_beats_hf_endpoint(server, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9
    download_hub_model("hf:owner/tiny", tmp_path, server.url, progress=False)
    assert hub.resolve_endpoint() == "http://127.0.0.1:9" and hub.resolve_endpoint("x/") == "x"
    monkeypatch.delenv("HF_ENDPOINT")
    assert hub.resolve_endpoint() == "https://huggingface.co"


def test_sha256_comes_from_x_linked_etag_only_for_lfs_files_and_every_size_from_head(server):
    url = f"{server.url}/owner/tiny/resolve/main"
    lfs = (FIXTURE / LFS).read_bytes()
    assert hub.server_file_info(f"{url}/{LFS}", {}) == (hashlib.sha256(lfs).hexdigest(), len(lfs))
    config = (FIXTURE / "config.json").stat().st_size  # a git sha1 ETag is not a sha256
    assert hub.server_file_info(f"{url}/config.json", {}) == (None, config)


def test_cut_transfer_resumes_with_range_and_is_verified(server, hub_root, tmp_path, capsys):
    server.faults[LFS] = "cut"
    with pytest.raises(DownloadError, match="run again to resume") as e:
        download_hub_model("hf:owner/long", tmp_path, server.url, progress=False)
    assert "\n" not in str(e.value)
    folder, served = tmp_path / "owner" / "long", hub_root / "owner" / "long" / "resolve" / "main" / LFS
    part = (folder / (LFS + ".part")).stat().st_size
    assert not (folder / LFS).exists() and 0 < part < served.stat().st_size
    del server.faults[LFS]
    model = gpt2np.load_model("hf:owner/long", tmp_path, hf_endpoint=server.url)
    assert [r for p, r in server.requests if p.endswith(LFS)] == [None, f"bytes={part}-"]
    assert (folder / LFS).read_bytes() == served.read_bytes() and model.n_ctx == LONG_CTX
    assert "model.safetensors (resumed)" in capsys.readouterr().err  # download.py's progress bar


def test_wrong_sha256_keeps_nothing_and_is_one_line(server, tmp_path):
    server.wrong_sha256 = "ab" * 32
    with pytest.raises(DownloadError) as e:
        download_hub_model("hf:owner/tiny", tmp_path, server.url, progress=False)
    message = str(e.value)
    assert "\n" not in message and f"not the expected {'ab' * 32}" in message and "OpenAI" not in message
    folder = tmp_path / "owner" / "tiny"
    assert not (folder / LFS).exists() and not (folder / (LFS + ".part")).exists()
    assert (folder / "config.json").is_file()  # the files that were right are kept


def test_renamed_repository_is_followed_for_the_sha256_and_the_file(server, tmp_path):
    server.renamed["old/tiny"] = "owner/tiny"
    server.wrong_sha256 = "cd" * 32  # proves the sha256 was read behind the redirect
    with pytest.raises(DownloadError, match="not the expected " + "cd" * 32):
        download_hub_model("hf:old/tiny", tmp_path, server.url, progress=False)
    server.wrong_sha256 = None
    folder = download_hub_model("hf:old/tiny", tmp_path, server.url, progress=False)
    assert folder == tmp_path / "old" / "tiny" and (folder / LFS).read_bytes() == (FIXTURE / LFS).read_bytes()


def test_missing_repository_is_one_line_with_the_token_hint(server, tmp_path):
    with pytest.raises(DownloadError) as e:
        download_hub_model("hf:owner/absent", tmp_path, server.url, progress=False)
    assert "\n" not in str(e.value) and "HTTP 404" in str(e.value) and "HF_TOKEN" in str(e.value)


def test_a_failed_download_leaves_no_folder_it_made(server, tmp_path):
    """Nothing fetched: the folders this download made are gone again; a folder that was there stays."""
    (tmp_path / "mine" / "owner").mkdir(parents=True)
    for models_dir in (tmp_path / "weights", tmp_path / "mine"):
        with pytest.raises(DownloadError, match="HTTP 404"):
            download_hub_model("hf:owner/absent", models_dir, server.url, progress=False)
        with pytest.raises(DownloadError, match="cannot reach"):
            download_hub_model("hf:owner/tiny", models_dir, "http://127.0.0.1:9", progress=False)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["mine", "mine/owner"]


def test_unreachable_endpoint_is_one_line(tmp_path):
    with pytest.raises(DownloadError, match="cannot reach http://127.0.0.1:9/owner/tiny"):
        download_hub_model("hf:owner/tiny", tmp_path, "http://127.0.0.1:9", progress=False)


@pytest.mark.parametrize("name, expected", [
    ("hf:distilbert/distilgpt2", ("distilbert/distilgpt2", "main")),
    ("hf:gpt2", ("gpt2", "main")),
    ("hf:openai-community/gpt2-medium@6dcaa7a", ("openai-community/gpt2-medium", "6dcaa7a")),
    ("hf:owner/name@refs/pr/1", ("owner/name", "refs/pr/1")),
])
def test_hub_names(name, expected):
    assert parse_hub_name(name) == expected


@pytest.mark.parametrize("name", ["hf:", "hf:a/b/c", "hf:../x", "hf:owner/..", "hf:a b", "hf:owner/name@"])
def test_bad_hub_names_are_refused(name):
    with pytest.raises(ValueError, match="is not a Hub model name"):
        parse_hub_name(name)


def test_revision_with_a_slash_stays_one_folder():
    assert hub.hub_folder("w", "o/n", "refs/pr/1").as_posix() == "w/o/n@refs%2Fpr%2F1"
    assert hub.file_url("E", "o/n", "refs/pr/1", "config.json") == "E/o/n/resolve/refs%2Fpr%2F1/config.json"


def test_a_mirror_without_head_still_downloads_unverified(hub_root, tmp_path):
    """A plain file server answers HEAD with 501: no sha256 to check, size still checked."""
    with FixtureServer(hub_root) as plain:  # tests/http_fixture_server.py's own handler: GET only
        folder = download_hub_model("hf:owner/tiny", tmp_path, plain.url, progress=False)
    assert (folder / LFS).read_bytes() == (FIXTURE / LFS).read_bytes()


# ---- files cut short: small files have no sha256, and a mirror may send no length ---------------------

SMALL = ("config.json", "vocab.json", "merges.txt")


@pytest.mark.parametrize("name", SMALL)
def test_small_file_cut_without_any_length_never_gets_its_name(hub_root, tmp_path, name):
    """The audit's case: a mirror without HEAD (no sha256, no size) and a GET without Content-Length, cut
    half-way. The cut config.json / vocab.json / merges.txt got its final name and was never fetched again;
    now its parse fails before the rename, the .part stays to be resumed, and the next run finishes it."""
    with FixtureServer(hub_root) as plain:  # tests/http_fixture_server.py's own handler: no HEAD
        plain.faults[name] = "nolength_cut"
        with pytest.raises(DownloadError) as e:
            download_hub_model("hf:owner/tiny", tmp_path, plain.url, progress=False)
        message, folder = str(e.value), tmp_path / "owner" / "tiny"
        assert "\n" not in message and message.startswith(f"download of {plain.url}/owner/tiny/resolve/main/{name} "
                                                           f"ended at ") and "cut short? run again to resume" in message
        assert "delete it" not in message  # the loaders' advice for a file, not for a download to resume
        assert not (folder / name).exists() and (folder / (name + ".part")).is_file()
        del plain.faults[name]
        model = gpt2np.load_model("hf:owner/tiny", tmp_path, hf_endpoint=plain.url)
    assert all((folder / f).read_bytes() == (FIXTURE / f).read_bytes() for f in HUB_FILES)
    assert not list(folder.glob("*.part")) and model.tokenizer.encode(" the") == [258]


def test_small_file_cut_is_caught_by_the_size_the_head_gave(server, tmp_path):
    server.faults["config.json"] = "nolength_cut"
    size = (FIXTURE / "config.json").stat().st_size
    with pytest.raises(DownloadError, match=rf"config.json stopped at {size // 2} of {size} bytes .*run again to resume"):
        download_hub_model("hf:owner/tiny", tmp_path, server.url, progress=False)
    assert not (tmp_path / "owner" / "tiny" / "config.json").exists()


def test_merges_cut_at_a_line_end_is_refused_before_its_rename(tmp_path):
    """A cut at a line's end leaves every line whole: only the tokens no merge makes any more tell."""
    (tmp_path / "vocab.json").write_bytes((FIXTURE / "vocab.json").read_bytes())
    text = (FIXTURE / "merges.txt").read_text(encoding="utf-8")
    part = tmp_path / "merges.txt.part"
    part.write_text(text[:text.index("\n", len(text) // 2) + 1], encoding="utf-8")
    with pytest.raises(ValueError, match=r"merges.txt.part has \d merges, but no merge makes \d of the 267 tokens of "
                                         r"vocab.json \(e.g. '\w+'\)$"):
        hub.check_merges(part)
    part.write_text(text, encoding="utf-8")
    hub.check_merges(part)


def test_a_whole_file_that_is_not_a_json_object_is_deleted(server, hub_root, tmp_path):
    wrong = copy_fixture(FIXTURE, hub_root / "owner" / "listed" / "resolve" / "main")
    (wrong / "config.json").write_text("[1, 2, 3]")
    with pytest.raises(DownloadError, match=r"config.json: config.json is not a JSON object; deleted the "
                                            r"download; check the repository name") as e:
        download_hub_model("hf:owner/listed", tmp_path, server.url, progress=False)
    assert "\n" not in str(e.value) and not (tmp_path / "owner").exists()  # nothing kept: no folder either


@pytest.mark.parametrize("name, says", [("config.json", "is not valid JSON"), ("vocab.json", "is not valid JSON"),
                                        ("merges.txt", "but no merge makes")])
def test_a_file_cut_before_this_check_says_to_delete_it_and_a_new_download_mends_it(server, tmp_path, name, says):
    """A file an older gpt2np gave its name cut short: loading names it and says what to do, which works."""
    folder = copy_fixture(FIXTURE, tmp_path / "owner" / "tiny", ignore=["reference.npz"])
    text = (folder / name).read_bytes()
    (folder / name).write_bytes(text[:text.index(b"\n", len(text) // 2) + 1] if name == "merges.txt" else
                                text[:len(text) // 2])
    with pytest.raises(ValueError) as e:
        gpt2np.load_model("hf:owner/tiny", tmp_path, hf_endpoint=server.url)
    message = str(e.value)
    assert "\n" not in message and message.startswith(str(folder / name)) and says in message, message
    assert message.endswith("delete it and download it again") and not server.seen  # the files were all there
    (folder / name).unlink()
    gpt2np.load_model("hf:owner/tiny", tmp_path, hf_endpoint=server.url)
    assert gets(server) == [f"/owner/tiny/resolve/main/{name}"] and (folder / name).read_bytes() == text
