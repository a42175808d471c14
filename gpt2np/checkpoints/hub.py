"""GPT-2s from the Hugging Face Hub: `hf:owner/name[@revision]` -> `<models_dir>/owner/name/`.

The Hub serves every file of a model repository at `<endpoint>/<repo>/resolve/<revision>/<file>`
(huggingface_hub's `hf_hub_url`). The endpoint is the `endpoint` argument (the commands'
`--hf_endpoint`), else the Hub's own `HF_ENDPOINT` variable, else https://huggingface.co; a token
in `HF_TOKEN` goes along as `Authorization: Bearer <token>` (gated and private repositories).

Four files make a GPT-2 (HUB_FILES); they are fetched by download.py's `fetch_file`, the one
downloader, with its guarantees: `.part` file, resume by Range, size against Content-Length,
atomic rename, progress bar. Before each GET a HEAD asks for the file's sha256 and size, which
the Hub sends for large (LFS) files as `X-Linked-Etag` and `X-Linked-Size`, and for small ones
the size as the HEAD's Content-Length (huggingface_hub reads the same headers); the file is
checked against them before the rename, and a mismatch keeps nothing. Small files have no
sha256 (their ETag is a git sha1), and a mirror may send no size at all, so each file is also
parsed before the rename (HUB_CHECKS): a transfer cut short cannot get the file's name.
Once all four files are in the folder, loading makes no request at all (like the release sizes).

>>> parse_hub_name("hf:distilbert/distilgpt2@main")
('distilbert/distilgpt2', 'main')
>>> hub_folder("weights", "distilbert/distilgpt2", "main").as_posix()
'weights/distilbert/distilgpt2'
"""
import os
import re
from pathlib import Path
from urllib.parse import quote, urljoin

from . import download
from .download import DownloadError, check_json_object, fetch_file
from .safetensors import read_header
from ..tokenizer.bpe import AGAIN, read_encoder, read_merges

HUB_PREFIX = "hf:"
DEFAULT_ENDPOINT = "https://huggingface.co"
ENDPOINT_ENV, TOKEN_ENV = "HF_ENDPOINT", "HF_TOKEN"
HUB_FILES = ("config.json", "vocab.json", "merges.txt", "model.safetensors")
NAME = re.compile(r"hf:(?P<repo>[\w.-]+(?:/[\w.-]+)?)(?:@(?P<revision>[\w./-]+))?")
SHA256 = re.compile(r'(?:W/)?"?([0-9a-fA-F]{64})"?')  # an ETag that is a sha256 (git blobs get sha1s)


def hub_hint(setting=f"${ENDPOINT_ENV}"):
    """The fix for a failed Hub download, naming the endpoint's environment variable (every caller
    has it); a command names its flag too (report.command_error_line)."""
    return (f"check the repository name and revision, set ${TOKEN_ENV} for a gated or private one, or point "
            f"{setting} at a working mirror")


HINT = hub_hint()


def parse_hub_name(name):  # "hf:owner/name@rev" -> ("owner/name", "rev")
    m = NAME.fullmatch(name)
    if not m or ".." in name:
        raise ValueError(f"{name!r} is not a Hub model name: write hf:owner/name or hf:owner/name@revision")
    return m["repo"], m["revision"] or "main"


def hub_folder(models_dir, repo, revision):
    """`<models_dir>/<repo>/` for main; another revision gets its own `<repo>@<revision>/`."""
    return Path(models_dir) / (repo if revision == "main" else f"{repo}@{quote(revision, safe='')}")


def resolve_endpoint(endpoint=None):
    """The argument wins, then $HF_ENDPOINT, then the Hub itself."""
    return (endpoint or os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT).rstrip("/")


def file_url(endpoint, repo, revision, name):
    return f"{endpoint}/{repo}/resolve/{quote(revision, safe='')}/{name}"


def auth_headers():
    token = os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


def download_hub_model(name, models_dir="weights", endpoint=None, progress=True):
    """Fetch the HUB_FILES of `hf:owner/name[@revision]` that are not there yet; return the folder."""
    repo, revision = parse_hub_name(name)
    folder = hub_folder(models_dir, repo, revision)
    missing = [f for f in HUB_FILES if not (folder / f).is_file()]
    if not missing:
        return folder
    created = download.make_folders(folder)
    endpoint, headers = resolve_endpoint(endpoint), auth_headers()
    try:
        with download.folder_lock(folder, progress):  # one download of a folder at a time (download.py, 7.)
            for file in [f for f in missing if not (folder / f).is_file()]:  # what another download left to do
                url = file_url(endpoint, repo, revision, file)
                sha256, size = server_file_info(url, headers)
                try:
                    fetch_file(url, folder / file, sha256, progress, headers=headers, size=size,
                               check=HUB_CHECKS[file])
                except DownloadError as e:  # download.py's messages point at OpenAI's release; point at the Hub
                    raise DownloadError(str(e).replace(download.HINT, HINT).replace("OpenAI's", "the server's")) \
                        from None
    except BaseException:
        download.remove_empty_folders(created)  # nothing fetched: no empty <models_dir>/owner/name/ left
        raise
    return folder


def server_file_info(url, headers, max_redirects=5):  # -> (hex sha256 or None, size in bytes or None)
    """HEAD the file: its sha256 from X-Linked-Etag (LFS files, on the Hub's redirect to its CDN) or a
    sha256 ETag; its size from X-Linked-Size, or a 200's Content-Length (small files). None for what
    the server does not send (a size of 0 counts as none: no HUB_FILES file is empty).

    Redirects within the Hub (a renamed repository) are followed; one to another host (the CDN) is
    not: the headers we want are on the Hub's own answer.
    """
    import requests  # here, not at the top (download.py's _get says why)
    headers = {**headers, "Accept-Encoding": "identity"}  # the file's own size, not a gzipped one's
    for _ in range(max_redirects):
        try:
            response = requests.head(url, headers=headers, allow_redirects=False, timeout=download.TIMEOUT)
        except requests.RequestException as e:
            raise DownloadError(f"cannot reach {url} ({download._root_cause(e)}); check the network, "
                                f"or {HINT}") from e
        if response.status_code in (405, 501):  # a plain file server without HEAD: nothing to check against
            return None, None
        if response.status_code >= 400:
            raise DownloadError(f"HEAD {url} failed with HTTP {response.status_code} {response.reason}; {HINT}")
        sha256, size = header_sha256(response.headers), header_size(response)
        location = response.headers.get("Location", "")
        if sha256 or size or not (300 <= response.status_code < 400 and location.startswith("/")):
            return sha256, size
        url = urljoin(url, location)
    return None, None


def header_sha256(headers):  # -> hex sha256, or None
    for name in ("X-Linked-Etag", "ETag"):
        m = SHA256.fullmatch(headers.get(name, ""))
        if m:
            return m[1].lower()
    return None


def header_size(response):  # -> bytes, or None
    """X-Linked-Size (LFS files, on the redirect), else a 200's Content-Length (a redirect's is its own body's)."""
    size = response.headers.get("X-Linked-Size") or (
        response.headers.get("Content-Length") if response.status_code == 200 else None)
    return int(size) if size and size.isdigit() and int(size) > 0 else None


def check_merges(path):
    """merges.txt against the vocab.json fetched before it (HUB_FILES' order): read_merges' checks, which
    catch a file cut short at any byte (bpe.check_made). A vocab.json that gpt2np cannot read is left for
    loading to name."""
    vocab = Path(path).with_name("vocab.json")
    try:
        encoder = read_encoder(vocab)
    except (OSError, ValueError):
        return
    try:
        read_merges(path, encoder, vocab)
    except ValueError as e:  # what to do about a download is fetch_file's to say (resume, or fetch anew)
        raise ValueError(str(e).removesuffix(f": {AGAIN}")) from None


# fetch_file's check of each file before it gets its name: small files come with no sha256, and with no
# size when the server sends no Content-Length (a mirror), so nothing else would notice one cut short
HUB_CHECKS = {"config.json": check_json_object, "vocab.json": check_json_object, "merges.txt": check_merges,
              "model.safetensors": read_header}  # the header's offsets must tile the file: a cut one fails
