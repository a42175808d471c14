"""Download OpenAI's GPT-2 release: seven files per size, into `<models_dir>/<size>/`.

OpenAI publishes each size (124M, 355M, 774M, 1558M) as `<base>/<size>/<file>` for the files in
`RELEASE_FILES`. The base URL is the `base_url` argument, else the environment variable
`GPT2NP_MIRROR`, else `DEFAULT_BASE_URL`.

The design makes a download safe to interrupt at any moment, and never gives a bad file its name:
1. A file under its final name is complete and checked, so it is never fetched again (unless it
   fails the same checks, e.g. one left there by another tool or by an older gpt2np).
2. Bytes stream into `<name>.part`. After an interruption the next run resumes that file with an
   HTTP `Range: bytes=N-` request; a server that ignores Range answers 200 and we start over. A
   server that answers 416 (nothing past byte N) has already sent all of it: the .part is checked
   and finished. A .part longer than the file is deleted and fetched again.
3. `<name>.part` is renamed with `os.replace` (atomic: no reader ever sees a half-written file under
   the final name) only after every check that applies: the byte count against Content-Length; the
   data file's against 4 bytes x n_params of hparams.json (fetched first, so a server that sends no
   Content-Length cannot pass off half a data file); the tokenizer files' sha256; and a parse of
   every other file (hparams.json, the .index's SSTable with its CRCs, the .meta's protobuf, the
   `checkpoint` text). A .part that fails a check is kept to be resumed when nothing says it is
   complete, and deleted when it is complete but wrong.
4. HTML/XML error pages are refused before a byte is written. The old storage.googleapis.com
   location answers with a small XML body that naive downloaders saved as the checkpoint.
5. A size name is a promise: `download_model("124M")` refuses an hparams.json that is not
   PRESETS["124M"] before anything else is fetched, and leaves the folder as it was.
6. The data file is checked against the index (fetched before it): every tensor's CRC32C, so a byte
   changed in transit is caught before the file gets its name, not at the first load.
7. One download of a folder at a time: a second process downloading into it waits for the first
   (an exclusive lock on `<folder>/.download.lock`, held while it downloads), then finds its files
   complete. Two at once resumed each other's .part and both failed, losing the data file.
8. A file of known size is refused before a byte is written when its folder's disk cannot hold it.
9. A transfer that brings fewer than STALLED[1] bytes in any STALLED[0] seconds is stopped (its .part
   kept to resume): a server that sends a byte every minute never trips the wait between bytes.

Fetching 124M needs the internet (about 500 MB), so this example is not run as a test:

>>> download_model("124M")  # doctest: +SKIP
PosixPath('weights/124M')
"""
import contextlib
import errno
import hashlib
import itertools
import json
import os
import re
import shutil
import sys
from pathlib import Path

from .tf_reader import REDOWNLOAD, check_data_file, check_meta_graph, read_index
from ..model.config import PRESETS, GPT2Config
from ..tokenizer.bpe import OPENAI_SHA256

DEFAULT_BASE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/models"
MIRROR_ENV = "GPT2NP_MIRROR"
SIZES = tuple(name for name in PRESETS if name != "tiny")  # the sizes OpenAI released
DATA_FILE = "model.ckpt.data-00000-of-00001"
RELEASE_FILES = ("checkpoint", "encoder.json", "hparams.json", "model.ckpt.index", DATA_FILE,  # the index first:
                 "model.ckpt.meta", "vocab.bpe")                                             # it checks the data
LOCK_FILE = ".download.lock"  # in the folder being downloaded: held while a process downloads into it
# The tokenizer files are the same for every size; tiktoken pins these hashes (openai_public.py).
KNOWN_SHA256 = dict(OPENAI_SHA256)
TIMEOUT = (10, 60)   # seconds: (connect, wait between bytes)
STALLED = (120, 1 << 14)  # (seconds, bytes): fewer bytes than this in any window this long stops a download (a
                          # byte every 59 s passes TIMEOUT for ever; 16 KiB in 2 minutes is 0.13 KiB/s)
CHUNK = 1 << 20      # bytes per read of a file on disk (file_sha256)
READ_CHUNK = 1 << 16  # bytes per read of a download and per progress-bar update (a cut loses less than this)
ERROR_CONTENT_TYPES = ("text/html", "application/xml", "text/xml")
ERROR_PREFIXES = (b"<?xml", b"<!doctype", b"<html", b"<error")  # compared lowercased


def mirror_hint(setting=f"${MIRROR_ENV}"):
    """The fix for a failed download: another mirror. The library names the setting every caller
    has, the environment variable; a command names its flag too (report.command_error_line)."""
    return f"point {setting} at a working mirror of {DEFAULT_BASE_URL}"


HINT = mirror_hint()


class DownloadError(Exception):
    """A download failed; the message says what failed and how to fix it."""


class WrongFile(ValueError):
    """Raised by a fetch_file check for content that is whole but not the file wanted (another
    model's hparams.json): the .part is deleted even when no Content-Length says it is complete."""


def download_model(size, models_dir="weights", base_url=None, progress=True):
    """Download GPT-2 `size` (one of SIZES) into `<models_dir>/<size>/` and return that folder."""
    if size not in SIZES:
        raise ValueError(f"unknown GPT-2 size {size!r}; choose one of {', '.join(SIZES)}")
    url = f"{resolve_base_url(base_url)}/{size}"
    return download_release(url, Path(models_dir) / size, progress=progress, preset=size)


def resolve_base_url(base_url=None):
    """The argument wins, then $GPT2NP_MIRROR, then OpenAI's own location."""
    return (base_url or os.environ.get(MIRROR_ENV) or DEFAULT_BASE_URL).rstrip("/")


def download_release(url, model_dir, known_sha256=KNOWN_SHA256, progress=True, preset=None):
    """Fetch the RELEASE_FILES from `<url>/<file>` into model_dir, hparams.json first.

    known_sha256 maps file names to their expected sha256 (tests serve stand-in tokenizer files).
    preset: a PRESETS name that hparams.json must describe, checked before any other file.
    """
    model_dir = Path(model_dir)
    created = make_folders(model_dir)
    try:
        with folder_lock(model_dir, progress):
            config = _fetch_hparams(f"{url}/hparams.json", model_dir / "hparams.json", preset, progress)
            for name in RELEASE_FILES:
                if name != "hparams.json":
                    size = 4 * config.n_params() if name == DATA_FILE else None  # raw float32, no header
                    check = (lambda path: check_data_file(model_dir / "model.ckpt.index", path)) \
                        if name == DATA_FILE else FORMAT_CHECKS.get(name)
                    fetch_file(f"{url}/{name}", model_dir / name, known_sha256.get(name), progress,
                               size=size, check=check)
    except BaseException:
        remove_empty_folders(created)  # refused before anything was kept: no trace left
        raise
    return model_dir


@contextlib.contextmanager
def folder_lock(folder, progress=True):
    """Hold `<folder>/.download.lock` exclusively (fcntl.flock: released by the system if the process dies),
    waiting for a process that holds it; the file is removed on the way out. A lock taken on a file another
    process removed meanwhile is taken again on the new one. Without fcntl (Windows), or on a file system
    that refuses locks (some network ones: ENOLCK), no lock: downloads run as before."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    path, said = Path(folder) / LOCK_FILE, False
    while True:
        f = open(path, "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress and not said:
                print(f"waiting for another download into {folder} to finish", file=sys.stderr, flush=True)
                said = True
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError:  # no locks on this file system
            f.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            yield
            return
        try:
            same = os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:  # its holder removed it while we waited: lock the new one
            same = False
        if same:
            break
        f.close()
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):  # someone removed it: the lock held all the same
            os.unlink(path)  # before the lock is released: a waiter then finds it gone and locks a new file
        f.close()


def make_folders(folder):  # -> the folders this call created, deepest first
    """mkdir -p folder, remembering which folders did not exist, for remove_empty_folders; a folder that
    cannot be made (read-only, no permission) is a DownloadError that says which."""
    created, missing = [], Path(folder)
    while not missing.exists() and missing != missing.parent:
        created.append(missing)
        missing = missing.parent
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        remove_empty_folders([f for f in created if f.exists()])  # the ones made before the one that failed
        raise DownloadError(f"cannot make the folder {folder} ({e.strerror or e}): download into a folder you "
                            f"can write (models_dir)") from None
    return created


def remove_empty_folders(created):
    """After a failed download: the folders make_folders created, deepest first, while they are empty.
    A folder that holds something (a checked file, a .part to resume) stays, and so do the ones above it;
    a folder that was there before is never in `created`."""
    for folder in created:
        try:
            folder.rmdir()  # only an empty folder: never anything in it
        except OSError:
            return


def _fetch_hparams(url, dest, preset, progress):  # -> GPT2Config
    """hparams.json first: the data file's size comes from it, and a size name is a promise."""
    if preset is not None and dest.is_file():
        try:
            existing = GPT2Config.from_hparams_json(dest)
        except ValueError:  # damaged: fetched again below
            existing = None
        if existing is not None:
            existing.check_preset(preset, dest)  # the folder's own file: refuse, never overwrite

    def check(path):
        config = GPT2Config.from_hparams_json(path)  # ValueError: cut short, or not hparams at all
        try:
            if preset is not None:
                config.check_preset(preset, "it")  # DownloadError: "<url>: it describes ..."
        except ValueError as e:  # it parsed, so it is whole: another model
            raise WrongFile(str(e)) from None
    fetch_file(url, dest, progress=progress, check=check)
    return GPT2Config.from_hparams_json(dest)


def fetch_file(url, dest, sha256=None, progress=True, headers=None, *, size=None, check=None):
    """Download url to dest through `<dest>.part`, resuming a partial one; skip a complete dest.

    headers: extra request headers (hub.py sends the Hub's `Authorization: Bearer` token).

    Nothing gets dest's name unchecked (module docstring, 3.): its byte count must equal
    Content-Length when the server sends one and `size` when given, its sha256 must be `sha256`
    when given, and check(path) must not raise ValueError (a parse check, e.g. for files of
    unknown size).
    """
    dest = Path(dest)
    if dest.exists() and _content_problem(dest, sha256, size, check)[0] is None:
        return dest  # a file under its final name was checked before the rename
    part = dest.with_name(dest.name + ".part")
    start = part.stat().st_size if part.exists() else 0
    with _get(url, start, headers) as response:
        if response.status_code == 416:  # nothing past `start`: the .part may be the whole file
            total = _unsatisfiable_total(response)
        else:
            offset, total = _byte_range(response, start, url)
            _stream(response, part, offset, total, url, progress, size)
    n, expected = part.stat().st_size, total if total is not None else size
    if expected is not None and n > expected:  # a .part longer than the file is no prefix of it
        part.unlink()
        if response.status_code == 416:
            return fetch_file(url, dest, sha256, progress, headers, size=size, check=check)  # from byte 0
        raise DownloadError(f"{url} sent {n:,} bytes but {expected:,} were expected; {HINT}")
    if expected is not None and n < expected:
        if response.status_code == 416:  # the server has no more: the wrong file, resuming cannot help
            part.unlink()
            raise DownloadError(f"{url} ends at byte {n:,} (HTTP 416) but {expected:,} bytes were "
                                f"expected; deleted the download; {HINT}")
        raise _interrupted(url, part, expected, "connection closed")  # urllib3 usually raises first
    return _finish(url, part, dest, sha256, size, check,
                   complete=expected is not None or response.status_code == 416)


def _finish(url, part, dest, sha256, size, check, complete):
    """Rename part to dest if it passes its checks. complete: the byte count is known to be right,
    so a failed check means a wrong file (deleted); else it may be cut short (kept, to resume)."""
    problem, whole = _content_problem(part, sha256, size, check)
    if problem is None:
        os.replace(part, dest)  # atomic: dest is either absent or complete
        return dest
    if complete or whole:
        part.unlink()  # complete but wrong: resuming it cannot help
        raise DownloadError(f"{url}: {problem}; deleted the download; {HINT}")
    raise DownloadError(f"download of {url} ended at {part.stat().st_size:,} bytes without a length, "
                        f"and {problem}: cut short? run again to resume from {part}")


def _content_problem(path, sha256, size, check):  # -> (None, or why path fails; whether it is whole)
    if size is not None and path.stat().st_size != size:
        return f"it has {path.stat().st_size:,} bytes, not {size:,}", False
    if sha256 is not None and file_sha256(path) != sha256:
        return f"its sha256 is {file_sha256(path)}, not the expected {sha256}", False
    try:
        if check is not None:
            check(path)
    except WrongFile as e:
        return str(e).splitlines()[0], True
    except ValueError as e:  # CheckpointError, JSONDecodeError, UnicodeDecodeError are ValueErrors
        return said_of_download(str(e).splitlines()[0], path), False
    return None, False


def said_of_download(problem, path):
    """A format check's words about a download: the file's name, not its .part's path, and not the reader's
    advice to delete and download it again (fetch_file says what it did: deleted it, or kept it to resume)."""
    return problem.replace(str(path), path.name.removesuffix(".part")).replace(f"; {REDOWNLOAD}", "")


def _get(url, start, extra_headers=None):
    """Start a streamed GET of url from byte `start` on; network and HTTP errors raise DownloadError.

    416 (Range Not Satisfiable) is returned, not raised: fetch_file finishes the .part it answers."""
    headers = {**(extra_headers or {}), "Accept-Encoding": "identity"}  # no gzip: byte counts must match Content-Length
    if start:
        headers["Range"] = f"bytes={start}-"
    import requests  # here, not at the top: with tqdm, a tenth of a second at every start of gpt2np
    try:
        response = requests.get(url, headers=headers, stream=True, timeout=TIMEOUT)
    except requests.TooManyRedirects as e:
        raise DownloadError(f"{url} redirects in a loop ({e}); check the URL, or {HINT}") from e
    except requests.RequestException as e:
        cause = _root_cause(e)  # e.g. "[Errno 111] Connection refused"
        raise DownloadError(f"cannot reach {url} ({cause}); check the network, or {HINT}") from e
    if response.status_code == 416 and start:
        return response
    if response.status_code >= 400:
        response.close()
        status = f"HTTP {response.status_code} {response.reason}"
        raise DownloadError(f"GET {url} failed with {status}; check the URL, or {HINT}")
    return response


def _unsatisfiable_total(response):  # -> the file's size from a 416's Content-Range, or None
    m = re.fullmatch(r"bytes \*/(\d+)", response.headers.get("Content-Range", ""))
    return int(m[1]) if m else None


def _byte_range(response, start, url):
    """(file offset of the body's first byte, file size or None): 200 restarts at 0, 206 resumes."""
    length = response.headers.get("Content-Length")
    length = None if length is None else int(length)
    if response.status_code != 206:
        return 0, length  # no Range sent, or the server ignored it: the body is the whole file
    content_range = response.headers.get("Content-Range", "")
    m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", content_range)
    if not m or int(m[1]) != start or (length is not None and start + length != int(m[3])):
        raise DownloadError(f"{url} answered Range bytes={start}- with Content-Range "
                            f"{content_range!r}; delete the .part file and run again")
    return start, int(m[3])


def _stream(response, part, offset, total, url, progress, size=None):
    """Write the body to `part` from `offset` on, with one byte-accurate progress bar; refuse an
    error page or a file whose announced size is not `size` before writing a byte."""
    import requests  # here, as in _get: only a download needs them
    from tqdm import tqdm
    name = part.name.removesuffix(".part")
    chunks = response.iter_content(READ_CHUNK)
    watch = StallWatch(response)
    try:
        first = next(chunks, b"")
        head = first if offset == 0 else b""  # a resumed body starts mid-file: nothing to sniff
        _refuse_error_page(url, response.headers.get("Content-Type", ""), head)
        if total is not None and size is not None and total != size:  # the wrong file, not a cut
            raise DownloadError(f"{url} is {total:,} bytes but {size:,} were expected; {HINT}")
        if total is not None:
            _check_room(part, total - offset)
        with open(part, "ab" if offset else "wb") as f, tqdm(
                desc=name + (" (resumed)" if offset else ""), total=total, initial=offset,
                unit="B", unit_scale=True, unit_divisor=1024, disable=not progress) as bar:
            for chunk in itertools.chain([first], chunks):
                f.write(chunk)
                bar.update(len(chunk))  # the bytes really written, not the chunk size asked for
                watch.bytes += len(chunk)
        if watch.stalled:  # no length announced: the shut-down connection read as the body's end
            raise _interrupted(url, part, total, watch.said())
    except requests.RequestException as e:
        raise _interrupted(url, part, total, watch.said() if watch.stalled else _root_cause(e)) from e
    except KeyboardInterrupt:  # Ctrl-C: beside the progress bar, where the bytes are and what to do next
        if progress and part.exists():
            print(f"interrupted: {part} keeps {part.stat().st_size:,} bytes; run again to resume", file=sys.stderr)
        raise
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        raise DownloadError(f"no space left on the disk of {part.parent} after {part.stat().st_size:,} bytes of "
                            f"{name}: free some space and run again to resume (or delete {part}), or download "
                            f"into another folder (models_dir)") from None
    finally:
        watch.stop()


class StallWatch:
    """A thread that stops a streamed response (shuts its socket for reading, which ends the read it is blocked in)
    when a window of STALLED[0] seconds brings fewer than STALLED[1] bytes; the reader adds to `bytes`. Where
    urllib3 cannot shut a response down (before 2.3), it watches nothing."""

    def __init__(self, response):
        import threading
        self.response, self.bytes, self.stalled = response, 0, False
        self.done = threading.Event()
        if callable(getattr(response.raw, "shutdown", None)):
            threading.Thread(target=self.watch, args=STALLED, name="gpt2np-download-stall", daemon=True).start()

    def watch(self, seconds, least):
        seen = 0
        while not self.done.wait(seconds):
            if self.bytes - seen < least:
                self.stalled = True
                with contextlib.suppress(Exception):  # already closed or released: nothing left to stop
                    self.response.raw.shutdown()
                return
            seen = self.bytes

    def said(self):
        return f"the server sent fewer than {STALLED[1]:,} bytes in {STALLED[0]} s"

    def stop(self):
        self.done.set()


def _check_room(part, needed):
    """A DownloadError, before a byte is written, when the disk of part's folder has less than `needed` free."""
    free = shutil.disk_usage(part.parent).free
    if free < needed:
        raise DownloadError(f"{part.name.removesuffix('.part')} needs {needed:,} more bytes but the disk of "
                            f"{part.parent} has {free:,} free: free some space, or download into another folder "
                            f"(models_dir)")


def _refuse_error_page(url, content_type, head):
    """Raise if the server sent an HTML/XML page (an error message) instead of the file."""
    kind = content_type.split(";")[0].strip().lower()
    if kind in ERROR_CONTENT_TYPES or head.lstrip()[:16].lower().startswith(ERROR_PREFIXES):
        raise DownloadError(f"{url} sent an error page ({kind or 'no Content-Type'}, "
                            f"starting {head[:60]!r}) instead of the file; check the URL, or {HINT}")


def _interrupted(url, part, total, cause):
    size = part.stat().st_size if part.exists() else 0
    of_total = f" of {total:,}" if total is not None else ""
    again = f"run again to resume from {part}" if size else "run again to download it"  # cut before a byte was kept
    return DownloadError(f"download of {url} stopped at {size:,}{of_total} bytes ({cause}); {again}")


def _root_cause(e):
    """The innermost exception, e.g. '[Errno 111] Connection refused' inside requests' wrappers."""
    while e.__cause__ or e.__context__:
        e = e.__cause__ or e.__context__
    return e


def file_sha256(path):
    """Hex sha256 of a file, read in CHUNK-sized blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


# ---- format checks for files whose size nothing announces (fetch_file's `check`) ---------------

def check_checkpoint_file(path):
    """TensorFlow's `checkpoint` file: text-format lines `name: "value"`, naming the checkpoint."""
    text = Path(path).read_text(encoding="utf-8")
    lines = text.split("\n")[:-1]  # a complete file ends with a newline
    if not text.endswith("\n") or not lines or "model_checkpoint_path" not in text \
            or not all(re.fullmatch(r'\w+: ".*"', line) for line in lines):
        raise ValueError(f"{path} is not a whole TensorFlow checkpoint file (lines like "
                         f'model_checkpoint_path: "model.ckpt")')


def check_json_object(path):
    """A whole JSON object: a file cut short never parses (its closing brace is gone)."""
    try:
        value = json.loads(Path(path).read_bytes())
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} is not a JSON object")


def check_vocab_bpe(path):
    """vocab.bpe: a `#version` line, then one merge per line, ending with a newline."""
    text = Path(path).read_text(encoding="utf-8")
    if not text.startswith("#version") or not text.endswith("\n"):
        raise ValueError(f"{path} is not a whole vocab.bpe (#version line ... final newline)")


FORMAT_CHECKS = {  # hparams.json has its own (_fetch_hparams); the data file is checked by size
    "checkpoint": check_checkpoint_file,
    "encoder.json": check_json_object,   # their sha256 is known too, when they are OpenAI's
    "vocab.bpe": check_vocab_bpe,
    "model.ckpt.index": read_index,      # the SSTable footer, block CRCs and entries
    "model.ckpt.meta": check_meta_graph,
}
