"""GPT-2s from the Hugging Face Hub: `hf:owner/name[@revision]` -> `<models_dir>/owner/name/`.

The Hub serves every file of a model repository at `<endpoint>/<repo>/resolve/<revision>/<file>`
(huggingface_hub's `hf_hub_url`). The endpoint is the `endpoint` argument (the commands'
`--hf_endpoint`), else the Hub's own `HF_ENDPOINT` variable, else https://huggingface.co; a token
in `HF_TOKEN` goes along as `Authorization: Bearer <token>` (gated and private repositories).

Four files make a GPT-2 (HUB_FILES); they are fetched by download.py's `fetch_file`, the one
downloader, with its guarantees: `.part` file, resume by Range, size against Content-Length,
atomic rename, progress bar. Before each GET a HEAD asks for the file's sha256, which the Hub
sends for large (LFS) files as `X-Linked-Etag` (huggingface_hub reads the same header); when it
is there the file is checked against it before the rename, and a mismatch keeps nothing.
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
from .download import DownloadError, fetch_file

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
        for file in missing:
            url = file_url(endpoint, repo, revision, file)
            try:
                fetch_file(url, folder / file, server_sha256(url, headers), progress, headers=headers)
            except DownloadError as e:  # download.py's messages point at OpenAI's release; point at the Hub
                raise DownloadError(str(e).replace(download.HINT, HINT).replace("OpenAI's", "the server's")) from None
    except BaseException:
        download.remove_empty_folders(created)  # nothing fetched: no empty <models_dir>/owner/name/ left
        raise
    return folder


def server_sha256(url, headers, max_redirects=5):  # -> hex sha256, or None if the server sends none
    """HEAD the file: X-Linked-Etag (LFS files, on the Hub's redirect to its CDN) or a sha256 ETag.

    Redirects within the Hub (a renamed repository) are followed; one to another host (the CDN) is
    not: the header we want is on the Hub's own answer.
    """
    import requests  # here, not at the top (download.py's _get says why)
    for _ in range(max_redirects):
        try:
            response = requests.head(url, headers=headers, allow_redirects=False, timeout=download.TIMEOUT)
        except requests.RequestException as e:
            raise DownloadError(f"cannot reach {url} ({download._root_cause(e)}); check the network, "
                                f"or {HINT}") from e
        if response.status_code in (405, 501):  # a plain file server without HEAD: no sha256 to check
            return None
        if response.status_code >= 400:
            raise DownloadError(f"HEAD {url} failed with HTTP {response.status_code} {response.reason}; {HINT}")
        for header in ("X-Linked-Etag", "ETag"):
            m = SHA256.fullmatch(response.headers.get(header, ""))
            if m:
                return m[1].lower()
        location = response.headers.get("Location", "")
        if not (300 <= response.status_code < 400 and location.startswith("/")):
            return None
        url = urljoin(url, location)
    return None
