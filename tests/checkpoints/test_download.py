"""gpt2np.checkpoints.download against a local HTTP server (tests/http_fixture_server.py), never the internet.

The server serves release-layout folders built from tests/fixtures/gpt2-tiny-a, with small generated
stand-ins for OpenAI's encoder.json and vocab.bpe (which must not be copied into the repository).
"""
import hashlib
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import gpt2np
from conftest import REPO, copy_fixture
from gpt2np.checkpoints import download
from gpt2np.model.config import PRESETS, GPT2Config
from gpt2np.checkpoints.download import DATA_FILE, RELEASE_FILES, DownloadError, download_model, download_release
from http_fixture_server import FixtureServer

FIXTURE = Path(__file__).parents[1] / "fixtures" / "gpt2-tiny-a"
STANDINS = {"encoder.json": b'{"!": 0, "\\"": 1, "<|endoftext|>": 2}',
            "vocab.bpe": b"#version: 0.2\n\xc4\xa0 t\n"}
STANDIN_SHA256 = {name: hashlib.sha256(body).hexdigest() for name, body in STANDINS.items()}
TINY_A = GPT2Config.from_hparams_json(FIXTURE / "hparams.json")


@pytest.fixture(scope="module")
def release_root(tmp_path_factory):
    """root/tiny-a: a consistent release; root/124M: the same, for download_model;
    root/bad-size: hparams.json says 3 layers, but the data file holds 2."""
    root = tmp_path_factory.mktemp("release")
    copy_fixture(FIXTURE, root / "tiny-a", ignore=["reference.npz"])
    for name, body in STANDINS.items():
        (root / "tiny-a" / name).write_bytes(body)
    shutil.copytree(root / "tiny-a", root / "124M")
    shutil.copytree(root / "tiny-a", root / "bad-size")
    hparams = json.loads((FIXTURE / "hparams.json").read_text()) | {"n_layer": 3}
    (root / "bad-size" / "hparams.json").write_text(json.dumps(hparams))
    return root


@pytest.fixture
def server(release_root):
    with FixtureServer(release_root) as s:
        yield s


def fetch(server, dest, folder="tiny-a", progress=False):
    url = f"{server.url}/{folder}"
    return download_release(url, dest, known_sha256=STANDIN_SHA256, progress=progress)


def assert_same_files(dest, source):
    for name in RELEASE_FILES:
        assert (dest / name).read_bytes() == (source / name).read_bytes(), name
    assert not list(dest.glob("*.part"))


def test_first_run_downloads_every_file_with_progress(server, release_root, tmp_path, capsys):
    dest = fetch(server, tmp_path / "tiny-a", progress=True)
    assert_same_files(dest, release_root / "tiny-a")
    err = capsys.readouterr().err
    for name in RELEASE_FILES:
        assert name in err
    assert "6.24M" in err  # the data file's size (6,542,976 B) in the bar, from Content-Length


def test_second_run_makes_no_request_and_progress_false_is_silent(server, tmp_path, capsys):
    fetch(server, tmp_path)
    assert len(server.requests) == len(RELEASE_FILES)
    fetch(server, tmp_path)
    assert len(server.requests) == len(RELEASE_FILES)
    assert capsys.readouterr().err == ""


def ranges_asked(server, name):
    """The Range header of every request the server saw for `name`, in order."""
    return [range_ for path, range_ in server.requests if path.endswith("/" + name)]


def test_cut_transfer_leaves_part_and_rerun_resumes_with_range(server, release_root, tmp_path, capsys):
    server.faults[DATA_FILE] = "cut"
    with pytest.raises(DownloadError, match="run again to resume"):
        fetch(server, tmp_path)
    assert not (tmp_path / DATA_FILE).exists()
    n = (tmp_path / (DATA_FILE + ".part")).stat().st_size
    assert 0 < n < (release_root / "tiny-a" / DATA_FILE).stat().st_size
    server.faults.clear()
    fetch(server, tmp_path, progress=True)
    assert ranges_asked(server, DATA_FILE) == [None, f"bytes={n}-"]
    assert f"{DATA_FILE} (resumed)" in capsys.readouterr().err
    assert_same_files(tmp_path, release_root / "tiny-a")


def test_server_ignoring_range_restarts_from_zero(server, release_root, tmp_path):
    server.faults[DATA_FILE] = "cut"
    with pytest.raises(DownloadError):
        fetch(server, tmp_path)
    server.faults[DATA_FILE] = "ignore_range"
    fetch(server, tmp_path)
    assert ranges_asked(server, DATA_FILE)[-1] is not None  # it asked for a range and got 200
    assert_same_files(tmp_path, release_root / "tiny-a")


def test_part_longer_than_the_file_is_fetched_again_from_zero(server, release_root, tmp_path):
    (tmp_path / "checkpoint.part").write_bytes(b"x" * 1000)  # server answers 416, bytes */77
    fetch(server, tmp_path)
    assert ranges_asked(server, "checkpoint") == ["bytes=1000-", None]
    assert_same_files(tmp_path, release_root / "tiny-a")


@pytest.mark.parametrize("fault, message", [
    ("404", "HTTP 404"), ("xml404", "HTTP 404"), ("xml200", "error page"), ("html", "text/html")])
@pytest.mark.parametrize("name", [DATA_FILE, "hparams.json"])
def test_error_replies_raise_and_leave_nothing(server, tmp_path, fault, message, name):
    server.faults[name] = fault
    with pytest.raises(DownloadError, match=message) as info:
        fetch(server, tmp_path)
    assert f"/tiny-a/{name}" in str(info.value) and "GPT2NP_MIRROR" in str(info.value)
    assert not (tmp_path / name).exists() and not (tmp_path / (name + ".part")).exists()


def test_unreachable_mirror_fails_at_its_one_refused_connection(tmp_path, monkeypatch):
    """What keeps a dead mirror from hanging, checked as behaviour, not as a wall-clock time: one GET, no
    retries; it carries download.TIMEOUT, whose connect limit (at most 10 s) is what ends a host that never
    answers; the refusal itself is the error, naming its cause and the fix; no folder is left."""
    import requests
    calls, real_get = [], requests.get

    def recording_get(url, **kwargs):
        calls.append((url, kwargs.get("timeout")))
        return real_get(url, **kwargs)

    monkeypatch.setattr(requests, "get", recording_get)
    with socket.socket() as s:  # take a free port, then close it: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DownloadError, match=r"cannot reach .*\(.*Connection refused\).*GPT2NP_MIRROR") as e:
        download_release(f"http://127.0.0.1:{port}/tiny-a", tmp_path, progress=False)
    assert "\n" not in str(e.value)
    assert calls == [(f"http://127.0.0.1:{port}/tiny-a/hparams.json", download.TIMEOUT)]
    connect, between_bytes = download.TIMEOUT  # (connect, read): a connect limit of its own
    assert 0 < connect <= 10 and between_bytes > 0
    assert not list(tmp_path.iterdir())


def test_tokenizer_hash_mismatch_is_refused(server, tmp_path):
    with pytest.raises(DownloadError, match="encoder.json: its sha256 is .*, not the expected 0{64}; deleted"):
        download_release(f"{server.url}/tiny-a", tmp_path, known_sha256={"encoder.json": "0" * 64},
                         progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "hparams.json"]  # no encoder.json(.part)


def test_existing_tokenizer_file_with_wrong_hash_is_fetched_again(server, release_root, tmp_path):
    (tmp_path / "vocab.bpe").write_bytes(b"a re-indented copy")
    fetch(server, tmp_path)
    assert_same_files(tmp_path, release_root / "tiny-a")


def test_data_size_mismatch_with_hparams_is_caught(server, release_root, tmp_path):
    n_params = GPT2Config.from_hparams_json(release_root / "bad-size" / "hparams.json").n_params()
    with pytest.raises(DownloadError, match=f"is 6,542,976 bytes but {4 * n_params:,} were expected"):
        fetch(server, tmp_path, folder="bad-size")  # refused from Content-Length, before streaming
    assert not (tmp_path / DATA_FILE).exists() and not (tmp_path / (DATA_FILE + ".part")).exists()


def test_download_model_uses_mirror_env_and_argument_beats_it(server, tmp_path, monkeypatch):
    for name, sha in STANDIN_SHA256.items():  # the stand-ins replace OpenAI's tokenizer files
        monkeypatch.setitem(download.KNOWN_SHA256, name, sha)
    monkeypatch.setitem(PRESETS, "124M", TINY_A)  # the mirror serves tiny-a as "124M"
    monkeypatch.setenv("GPT2NP_MIRROR", server.url + "/")
    assert download_model("124M", tmp_path, progress=False) == tmp_path / "124M"
    assert {path for path, _ in server.requests} == {f"/124M/{name}" for name in RELEASE_FILES}
    monkeypatch.setenv("GPT2NP_MIRROR", "http://127.0.0.1:9/unused")
    download_model("124M", tmp_path / "again", base_url=server.url, progress=False)
    assert len(server.requests) == 2 * len(RELEASE_FILES)


def test_base_url_precedence(monkeypatch):
    monkeypatch.delenv("GPT2NP_MIRROR", raising=False)
    assert download.resolve_base_url() == download.DEFAULT_BASE_URL
    monkeypatch.setenv("GPT2NP_MIRROR", "http://mirror.example/gpt-2/models/")
    assert download.resolve_base_url() == "http://mirror.example/gpt-2/models"
    assert download.resolve_base_url("http://arg.example") == "http://arg.example"


@pytest.mark.parametrize("size", ["tiny", "117M", "124m"])
def test_unknown_size_lists_the_valid_ones(size, tmp_path):
    with pytest.raises(ValueError, match="124M, 355M, 774M, 1558M"):
        download_model(size, tmp_path)


# ---- the fault table (issue 16, item 1): every fault ends in a correct file or a resumable .part ----

CUTS = ["cut", "nolength_cut", "reset", "nolength_reset"]  # see http_fixture_server.TRANSFER_FAULTS


@pytest.mark.parametrize("fault", CUTS)
@pytest.mark.parametrize("name", RELEASE_FILES)
def test_interrupted_transfer_never_gets_the_final_name_and_the_next_run_resumes(
        server, release_root, tmp_path, name, fault):
    """Without Content-Length a cut looks like a normal end of body: only the data file's size from
    hparams.json, the sha256 or a parse check can tell, and each file has one of them."""
    server.faults[name] = fault
    with pytest.raises(DownloadError, match="run again to (resume|download it)|cannot reach"):
        fetch(server, tmp_path)
    assert not (tmp_path / name).exists(), f"a cut {name} got its final name"
    part = tmp_path / (name + ".part")
    n = part.stat().st_size if part.exists() else 0
    assert n < (release_root / "tiny-a" / name).stat().st_size
    server.faults.clear()
    fetch(server, tmp_path)
    assert_same_files(tmp_path, release_root / "tiny-a")
    assert ranges_asked(server, name)[-1] == (f"bytes={n}-" if n else None)  # resumed where it stopped


def test_files_without_content_length_pass_their_checks(server, release_root, tmp_path):
    server.faults.update({name: "nolength" for name in RELEASE_FILES})
    fetch(server, tmp_path)
    assert_same_files(tmp_path, release_root / "tiny-a")


@pytest.mark.parametrize("fault", [None, "bare416"])
@pytest.mark.parametrize("name", RELEASE_FILES)
def test_complete_part_answered_416_is_finished(server, release_root, tmp_path, name, fault):
    """A run that died after the last byte and before the rename: the server answers the resume
    with 416 (with or without Content-Range: bytes */size); the .part is checked and renamed."""
    source = release_root / "tiny-a" / name
    if name != "hparams.json":  # hparams.json comes first; give the others a folder that has it
        shutil.copy(release_root / "tiny-a" / "hparams.json", tmp_path / "hparams.json")
    (tmp_path / (name + ".part")).write_bytes(source.read_bytes())
    server.faults[name] = fault
    fetch(server, tmp_path)
    assert ranges_asked(server, name) == [f"bytes={source.stat().st_size}-"]
    assert_same_files(tmp_path, release_root / "tiny-a")


@pytest.mark.parametrize("name", ["model.ckpt.index", "model.ckpt.meta", "checkpoint", "hparams.json"])
def test_complete_but_corrupt_part_answered_416_is_deleted_and_fetched_next_run(
        server, release_root, tmp_path, name):
    raw = bytearray((release_root / "tiny-a" / name).read_bytes())
    raw[0] = ord("?")  # index: a block CRC; meta: an invalid wire type; checkpoint, hparams: not text
    (tmp_path / (name + ".part")).write_bytes(bytes(raw))
    with pytest.raises(DownloadError, match="deleted the download"):
        fetch(server, tmp_path)
    assert not (tmp_path / name).exists() and not (tmp_path / (name + ".part")).exists()
    fetch(server, tmp_path)
    assert_same_files(tmp_path, release_root / "tiny-a")


@pytest.mark.parametrize("name", RELEASE_FILES)
def test_cut_file_under_its_final_name_is_fetched_again(server, release_root, tmp_path, name):
    """Left by an older gpt2np, which renamed cut files: the same checks run on files already there."""
    fetch(server, tmp_path)
    whole = (release_root / "tiny-a" / name).read_bytes()
    (tmp_path / name).write_bytes(whole[:len(whole) // 2])
    fetch(server, tmp_path)
    assert_same_files(tmp_path, release_root / "tiny-a")
    assert len(ranges_asked(server, name)) == 2


# ---- a size name is a promise (issue 13, item 1) ----------------------------------------------------

@pytest.mark.parametrize("fault", [None, "nolength"])
def test_mirror_serving_another_model_as_a_size_is_refused_before_anything_is_kept(server, tmp_path, fault):
    """Even without Content-Length: an hparams.json that parses is whole, so it is refused, not resumed."""
    server.faults["hparams.json"] = fault
    with pytest.raises(DownloadError, match=r"124M/hparams.json: it describes GPT2Config\(n_vocab=50257, n_ctx=64"
                                         r".*but 124M is GPT2Config\(n_vocab=50257, n_ctx=1024"):
        download_model("124M", tmp_path, base_url=server.url, progress=False)
    assert [path for path, _ in server.requests] == ["/124M/hparams.json"]  # nothing else fetched
    assert not list(tmp_path.iterdir())  # the folder it made is gone again


def test_a_failed_download_leaves_no_folder_it_made(server, tmp_path):
    """models_dir/124M/ and models_dir itself are removed again when this call made them and nothing was kept;
    a folder that holds something (hparams.json, a .part to resume) stays."""
    with pytest.raises(DownloadError, match="cannot reach"):
        download_model("124M", tmp_path / "new" / "weights", base_url="http://127.0.0.1:9", progress=False)
    assert not list(tmp_path.iterdir())
    server.faults["checkpoint"] = "404"
    with pytest.raises(DownloadError):
        fetch(server, tmp_path / "weights" / "tiny-a")
    assert [p.name for p in (tmp_path / "weights" / "tiny-a").iterdir()] == ["hparams.json"]


def test_folder_with_another_models_hparams_is_refused_and_left_as_it_was(server, release_root, tmp_path):
    folder = tmp_path / "124M"
    shutil.copytree(release_root / "tiny-a", folder)  # complete: load_model does not download
    (folder / "vocab.bpe").unlink()                    # incomplete: load_model would download
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for _ in range(2):
        with pytest.raises(ValueError, match="hparams.json describes .* but 124M is"):
            gpt2np.load_model("124M", models_dir=tmp_path, base_url=server.url)
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # no cache, no download
        assert server.requests == []
        (folder / "vocab.bpe").write_bytes(STANDINS["vocab.bpe"])
        before = {p.name: p.read_bytes() for p in folder.iterdir()}


def test_main_refuses_a_mirrors_fake_size_in_one_line(server, tmp_path):
    out = subprocess.run([sys.executable, "main.py", "--mirror", server.url, "--target_model_size", "124M",
                          "--models_dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]  # after the progress bar
    assert out.returncode == 2 and len(errors) == 1 and out.stderr.endswith(errors[0] + "\n"), out.stderr
    assert "n_layer=2" in out.stderr and "n_layer=12" in out.stderr and "Traceback" not in out.stderr
    assert not list(tmp_path.iterdir())


def test_a_byte_changed_in_transit_is_caught_by_the_index_before_the_data_file_gets_its_name(
        server, release_root, tmp_path):
    """A data file of the right size with one byte changed got its name, and every later load failed its CRC
    until the user deleted it: the index (fetched first) now checks every tensor before the rename."""
    server.faults[DATA_FILE] = "flip"
    with pytest.raises(DownloadError, match=r"is corrupt: tensor .* fails its CRC32C check.*deleted the download"):
        fetch(server, tmp_path)
    assert not (tmp_path / DATA_FILE).exists() and not (tmp_path / (DATA_FILE + ".part")).exists()
    assert (tmp_path / "model.ckpt.index").is_file()  # fetched before the data, and kept
    server.faults.clear()
    fetch(server, tmp_path)
    assert_same_files(tmp_path, release_root / "tiny-a")


def test_a_second_download_into_the_same_folder_waits_for_the_first(server, release_root, tmp_path):
    """Two processes downloading one model into one folder resumed each other's .part: both failed and the data
    file was lost. The second now waits on the folder's lock, then finds every file complete."""
    import threading
    import time
    server.faults[DATA_FILE] = "hold"  # the first download stops half-way through the data file
    errors, first = [], threading.Thread(target=lambda: fetch(server, tmp_path))
    first.start()
    assert wait_for(lambda: any(path.endswith(DATA_FILE) for path, _ in server.requests)), "no data request"
    asked = len(server.requests)

    def second_download():
        try:
            fetch(server, tmp_path)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    second = threading.Thread(target=second_download)
    second.start()
    time.sleep(0.5)
    assert len(server.requests) == asked, f"the second download asked {server.requests[asked:]} while the first ran"
    server.release.set()
    first.join(timeout=30)
    second.join(timeout=30)
    assert not errors and not first.is_alive() and not second.is_alive(), errors
    paths = sorted(path.rsplit("/", 1)[-1] for path, _ in server.requests)
    assert paths == sorted(RELEASE_FILES), f"each file asked once, by the first download: {paths}"
    assert_same_files(tmp_path, release_root / "tiny-a")
    assert not (tmp_path / download.LOCK_FILE).exists()


def wait_for(condition, seconds=10):
    import time
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_file_the_disk_cannot_hold_is_refused_before_a_byte_is_written(server, tmp_path, monkeypatch):
    """A full disk was a bare "[Errno 28] No space left on device" after a .part had filled it."""
    real = shutil.disk_usage
    monkeypatch.setattr(download.shutil, "disk_usage", lambda path: real(path)._replace(free=0))
    with pytest.raises(DownloadError, match=r"^hparams.json needs \d+ more bytes but the disk of .* has 0 free: "
                                            r"free some space, or download into another folder \(models_dir\)$"):
        fetch(server, tmp_path / "m")
    assert not (tmp_path / "m").exists()  # nothing written, and the folder it made removed


def test_a_disk_that_fills_during_a_download_is_one_line_that_keeps_the_part(server, tmp_path, monkeypatch):
    import errno

    def full(writes, written, data):  # the disk fills after 10 bytes
        return OSError(errno.ENOSPC, "No space left on device") if written + len(data) > 10 else None
    failing_writes(monkeypatch, full)
    with pytest.raises(DownloadError, match=r"^no space left on the disk of .* after 0 bytes of hparams.json: free "
                                            r"some space and run again to resume \(or delete .*hparams.json.part\)"):
        fetch(server, tmp_path)


def test_a_folder_that_cannot_be_made_is_one_line_naming_it(server, tmp_path, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(DownloadError, match=r"^cannot make the folder .*/a/b \(Permission denied\): download into a "
                                            r"folder you can write \(models_dir\)$"):
        fetch(server, tmp_path / "a" / "b")


def test_a_redirect_loop_is_said_as_one(server, tmp_path):
    """It said "cannot reach ... check the network" where the server answered every time."""
    server.faults["hparams.json"] = "loop"
    with pytest.raises(DownloadError, match=r"hparams.json redirects in a loop \(.*\); check the URL, or point"):
        fetch(server, tmp_path)


def test_main_names_its_flag_where_the_library_says_models_dir(server, tmp_path, monkeypatch, main_here):
    real = shutil.disk_usage
    monkeypatch.setattr(download.shutil, "disk_usage", lambda path: real(path)._replace(free=0))
    out = main_here("--mirror", server.url, "--target_model_size", "124M", "--models_dir", str(tmp_path / "m"))
    assert out.returncode == 2 and out.stderr.startswith("error: hparams.json needs ") and out.stderr.endswith(
        "free: free some space, or download into another folder (--models_dir)\n"), out.stderr


def test_a_damaged_index_is_said_of_the_file_with_what_was_done(server, tmp_path, monkeypatch):
    """A whole but damaged index said both "delete it and download it again" (the reader's advice) and "deleted
    the download", and named the .part's path: now the file's name and what fetch_file did."""
    index = (FIXTURE / "model.ckpt.index").read_bytes()
    damaged = tmp_path / "served"
    copy_fixture(FIXTURE, damaged / "tiny-a", ignore=["reference.npz"])
    for name, body in STANDINS.items():
        (damaged / "tiny-a" / name).write_bytes(body)
    middle = len(index) // 2  # inside a block: its CRC fails
    (damaged / "tiny-a" / "model.ckpt.index").write_bytes(index[:middle] + bytes([index[middle] ^ 0xFF]) +
                                                          index[middle + 1:])
    with FixtureServer(damaged) as bad, pytest.raises(DownloadError) as info:
        fetch(bad, tmp_path / "m")
    said = str(info.value)
    assert "model.ckpt.index: model.ckpt.index " in said and "deleted the download" in said, said
    assert ".part" not in said and "download it again" not in said, said


def test_ctrl_c_in_a_download_says_where_the_bytes_are(server, tmp_path, monkeypatch, capsys):
    """Ctrl-C mid-file exited 130 with nothing said: beside the progress bar, the .part and how to go on."""
    monkeypatch.setattr(download, "READ_CHUNK", 64)  # the data file in several writes
    failing_writes(monkeypatch, lambda writes, written, data: KeyboardInterrupt() if writes >= 1 else None)
    with pytest.raises(KeyboardInterrupt):
        fetch(server, tmp_path, progress=True)
    part = tmp_path / "hparams.json.part"
    assert capsys.readouterr().err.endswith(f"interrupted: {part} keeps 64 bytes; run again to resume\n")
    monkeypatch.undo()
    fetch(server, tmp_path)  # and it does
    assert (tmp_path / DATA_FILE).is_file() and not part.exists()


def test_a_file_system_without_locks_downloads_as_before(server, release_root, tmp_path, monkeypatch):
    """flock refused (ENOLCK on some network file systems): no lock, the download runs, no lock file is left."""
    import errno
    import fcntl

    def flock(f, how):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", flock)
    fetch(server, tmp_path)
    assert_same_files(tmp_path, release_root / "tiny-a")
    assert not (tmp_path / download.LOCK_FILE).exists()


def failing_writes(monkeypatch, fails):
    """Files download.py opens write until fails(writes so far, bytes so far, data) returns an exception, raised
    in place of that write (a disk that fills, a Ctrl-C mid-file); the lock file's fileno still works."""
    class Failing:
        def __init__(self, f):
            self.f, self.writes, self.written = f, 0, 0

        def write(self, data):
            error = fails(self.writes, self.written, data)
            if error is not None:
                raise error
            self.writes, self.written = self.writes + 1, self.written + len(data)
            return self.f.write(data)

        def fileno(self):
            return self.f.fileno()

        def close(self):
            self.f.close()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()
    monkeypatch.setattr(download, "open", lambda *a, **k: Failing(open(*a, **k)), raising=False)


@pytest.mark.parametrize("fault", ["trickle", "nolength_trickle"])
def test_a_server_that_trickles_is_stopped_and_the_next_run_resumes(server, release_root, tmp_path, monkeypatch,
                                                                    fault):
    """A server that sends a byte now and then never trips the wait between bytes (60 s), so a download from it
    ran for ever: fewer than STALLED[1] bytes in STALLED[0] seconds now stop it, the .part kept, and the next run
    resumes. Here 20 bytes a second against 1 KiB in half a second; the resumed transfer, at full speed under
    the same limits, is not stopped."""
    import time
    monkeypatch.setattr(download, "STALLED", (0.5, 1024))
    server.faults[DATA_FILE] = fault
    started = time.monotonic()
    with pytest.raises(DownloadError) as stopped:
        fetch(server, tmp_path)
    seconds = time.monotonic() - started
    server.release.set()  # the server's trickle ends
    part = tmp_path / (DATA_FILE + ".part")
    n = part.stat().st_size
    assert seconds < 30 and 0 < n < (release_root / "tiny-a" / DATA_FILE).stat().st_size, (seconds, n)
    assert "(the server sent fewer than 1,024 bytes in 0.5 s); run again to resume from" in str(stopped.value), \
        str(stopped.value)
    server.faults.clear()
    fetch(server, tmp_path)
    assert_same_files(tmp_path, release_root / "tiny-a")
    assert ranges_asked(server, DATA_FILE)[-1] == f"bytes={n}-"
