"""Download OpenAI's GPT-2 release: seven files per size, into `<models_dir>/<size>/`.

OpenAI publishes each size (124M, 355M, 774M, 1558M) as `<base>/<size>/<file>` for the files in
`RELEASE_FILES`. The base URL is the `base_url` argument, else the environment variable
`GPT2NP_MIRROR`, else `DEFAULT_BASE_URL`.

The design makes a download safe to interrupt at any moment:
1. A file under its final name is complete and checked, so it is never fetched again (except a
   tokenizer file whose sha256 is wrong, e.g. one left there by another tool).
2. Bytes stream into `<name>.part`. After an interruption the next run resumes that file with an
   HTTP `Range: bytes=N-` request; a server that ignores Range answers 200 and we start over.
3. Only when the byte count matches Content-Length (and, for the tokenizer files, the sha256
   matches) is `<name>.part` renamed with `os.replace`, which is atomic: no reader ever sees a
   half-written file under the final name.
4. HTML/XML error pages are refused before a byte is written. The old storage.googleapis.com
   location answers with a small XML body that naive downloaders saved as the checkpoint.
5. At the end the data file must hold exactly 4 bytes x n_params for the hparams.json beside it.
   That catches a wrong or truncated data file.

Fetching 124M needs the internet (about 500 MB), so this example is not run as a test:

>>> download_model("124M")  # doctest: +SKIP
PosixPath('weights/124M')
"""
import hashlib
import itertools
import os
import re
from pathlib import Path

import requests
from tqdm import tqdm

from .config import PRESETS, GPT2Config
from .tokenizer import OPENAI_SHA256

DEFAULT_BASE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/models"
MIRROR_ENV = "GPT2NP_MIRROR"
SIZES = tuple(name for name in PRESETS if name != "tiny")  # the sizes OpenAI released
DATA_FILE = "model.ckpt.data-00000-of-00001"
RELEASE_FILES = ("checkpoint", "encoder.json", "hparams.json", DATA_FILE,
                 "model.ckpt.index", "model.ckpt.meta", "vocab.bpe")
# The tokenizer files are the same for every size; tiktoken pins these hashes (openai_public.py).
KNOWN_SHA256 = dict(OPENAI_SHA256)
TIMEOUT = (10, 60)   # seconds: (connect, wait between bytes)
CHUNK = 1 << 20      # bytes per read and per progress-bar update
ERROR_CONTENT_TYPES = ("text/html", "application/xml", "text/xml")
ERROR_PREFIXES = (b"<?xml", b"<!doctype", b"<html", b"<error")  # compared lowercased
HINT = f"point base_url= or ${MIRROR_ENV} at a working mirror of {DEFAULT_BASE_URL}"


class DownloadError(Exception):
    """A download failed; the message says what failed and how to fix it."""


def download_model(size, models_dir="weights", base_url=None, progress=True):
    """Download GPT-2 `size` (one of SIZES) into `<models_dir>/<size>/` and return that folder."""
    if size not in SIZES:
        raise ValueError(f"unknown GPT-2 size {size!r}; choose one of {', '.join(SIZES)}")
    url = f"{resolve_base_url(base_url)}/{size}"
    return download_release(url, Path(models_dir) / size, progress=progress)


def resolve_base_url(base_url=None):
    """The argument wins, then $GPT2NP_MIRROR, then OpenAI's own location."""
    return (base_url or os.environ.get(MIRROR_ENV) or DEFAULT_BASE_URL).rstrip("/")


def download_release(url, model_dir, known_sha256=KNOWN_SHA256, progress=True):
    """Fetch the RELEASE_FILES from `<url>/<file>` into model_dir, then check the data file's size.

    known_sha256 maps file names to their expected sha256 (tests serve stand-in tokenizer files).
    """
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    for name in RELEASE_FILES:
        fetch_file(f"{url}/{name}", model_dir / name, known_sha256.get(name), progress)
    check_data_size(model_dir)
    return model_dir


def fetch_file(url, dest, sha256=None, progress=True, headers=None):
    """Download url to dest through `<dest>.part`, resuming a partial one; skip a complete dest.

    headers: extra request headers (hub.py sends the Hub's `Authorization: Bearer` token)."""
    dest = Path(dest)
    if dest.exists() and (sha256 is None or file_sha256(dest) == sha256):
        return dest  # a file under its final name was checked before the rename
    part = dest.with_name(dest.name + ".part")
    start = part.stat().st_size if part.exists() else 0
    with _get(url, start, headers) as response:
        offset, total = _byte_range(response, start, url)
        _stream(response, part, offset, total, url, progress)
    if total is not None and part.stat().st_size != total:  # closed early (urllib3 usually raises first)
        raise _interrupted(url, part, total, "connection closed")
    if sha256 is not None:
        _check_sha256(part, sha256, url)
    os.replace(part, dest)  # atomic: dest is either absent or complete
    return dest


def _get(url, start, extra_headers=None):
    """Start a streamed GET of url from byte `start` on; network and HTTP errors raise DownloadError."""
    headers = {**(extra_headers or {}), "Accept-Encoding": "identity"}  # no gzip: byte counts must match Content-Length
    if start:
        headers["Range"] = f"bytes={start}-"
    try:
        response = requests.get(url, headers=headers, stream=True, timeout=TIMEOUT)
    except requests.RequestException as e:
        cause = _root_cause(e)  # e.g. "[Errno 111] Connection refused"
        raise DownloadError(f"cannot reach {url} ({cause}); check the network, or {HINT}") from e
    status = f"HTTP {response.status_code} {response.reason}"
    if response.status_code == 416:  # the .part is already as long as the file (or longer)
        response.close()
        raise DownloadError(f"{url} cannot resume at byte {start:,} ({status}); "
                            "delete the .part file and run again")
    if response.status_code >= 400:
        response.close()
        raise DownloadError(f"GET {url} failed with {status}; check the URL, or {HINT}")
    return response


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


def _stream(response, part, offset, total, url, progress):
    """Write the body to `part` from `offset` on, with one byte-accurate progress bar."""
    name = part.name.removesuffix(".part")
    chunks = response.iter_content(CHUNK)
    try:
        first = next(chunks, b"")
        head = first if offset == 0 else b""  # a resumed body starts mid-file: nothing to sniff
        _refuse_error_page(url, response.headers.get("Content-Type", ""), head)
        with open(part, "ab" if offset else "wb") as f, tqdm(
                desc=name + (" (resumed)" if offset else ""), total=total, initial=offset,
                unit="B", unit_scale=True, unit_divisor=1024, disable=not progress) as bar:
            for chunk in itertools.chain([first], chunks):
                f.write(chunk)
                bar.update(len(chunk))  # the bytes really written, not the chunk size asked for
    except requests.RequestException as e:
        raise _interrupted(url, part, total, _root_cause(e)) from e


def _refuse_error_page(url, content_type, head):
    """Raise if the server sent an HTML/XML page (an error message) instead of the file."""
    kind = content_type.split(";")[0].strip().lower()
    if kind in ERROR_CONTENT_TYPES or head.lstrip()[:16].lower().startswith(ERROR_PREFIXES):
        raise DownloadError(f"{url} sent an error page ({kind or 'no Content-Type'}, "
                            f"starting {head[:60]!r}) instead of the file; check the URL, or {HINT}")


def _interrupted(url, part, total, cause):
    size = part.stat().st_size if part.exists() else 0
    of_total = f" of {total:,}" if total is not None else ""
    return DownloadError(f"download of {url} stopped at {size:,}{of_total} bytes ({cause}); "
                         f"run again to resume from {part}")


def _check_sha256(part, sha256, url):
    got = file_sha256(part)
    if got != sha256:
        part.unlink()  # complete but wrong: resuming it cannot help
        raise DownloadError(f"sha256 of {url} is {got}, not OpenAI's {sha256}; {HINT}")


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


def check_data_size(model_dir):
    """Raise DownloadError unless the data file holds 4 bytes for each parameter in hparams.json."""
    model_dir = Path(model_dir)
    try:
        n_params = GPT2Config.from_hparams_json(model_dir / "hparams.json").n_params()
    except ValueError as e:
        raise DownloadError(f"{e}; delete {model_dir} and download again") from e
    size = (model_dir / DATA_FILE).stat().st_size
    if size != 4 * n_params:  # raw float32, no header (the TF bundle's data file)
        raise DownloadError(f"{model_dir / DATA_FILE} has {size:,} bytes but hparams.json implies "
                            f"{4 * n_params:,} (4 x {n_params:,} float32 parameters); "
                            f"delete {model_dir} and download again")
