"""What the server shows of this machine: model names, never local paths.

A model or drafter loaded from a folder is listed (GET /v1/models), selected ("drafter") and
reported (statistics) by the folder's own name; every error message sent over HTTP goes through
`without_paths`, so a message from deeper down that names a file shows its name, not where it is.

>>> served_name("hf:owner/name"), served_name("124M")
('hf:owner/name', '124M')
>>> served_name(".") == os.path.basename(os.getcwd())
True
>>> without_paths(f"{os.getcwd()}/weights/124M is not a model folder; see GET /v1/models")
'…/124M is not a model folder; see GET /v1/models'
"""
import os
import re
from pathlib import Path

# an absolute path: /a/b (not inside a URL or a relative path: no word, '.', ':' or '/' before it)
# or C:\a\b; it ends at a space, a quote, a bracket or a comma
ABSOLUTE = re.compile(r"(?<![\w.:/~\\-])(?:/|[A-Za-z]:[\\/])[^\s'\"()\[\]{},;]*")


def served_name(name):
    """A model as the server names it: a folder by its own name (a folder of the Hub's cache,
    models--owner--name/..., by owner/name); anything else (a size, a bundled or Hub name) as given."""
    text = str(name)
    if text.startswith("hf:") or not Path(text).expanduser().is_dir():
        return text
    parts = Path(os.path.abspath(Path(text).expanduser())).parts
    hub = next((p for p in reversed(parts) if p.startswith("models--") and p.count("--") >= 2), None)
    return "/".join(hub.split("--")[1:]) if hub else parts[-1]


def hide_path(obj):
    """Give obj (a model or a drafter) its served name when its name is a folder's path."""
    name = getattr(obj, "name", None)
    if isinstance(name, str) and served_name(name) != name:
        obj.name = served_name(name)
    return obj


def _shorten(match):
    path = match.group(0)
    first = re.split(r"[\\/]", path.lstrip("/"), maxsplit=1)[0]
    if path.startswith("/") and not (first and os.path.exists("/" + first)):
        return path  # /v1/models, /docs: a route, not a file here
    return "…/" + [p for p in re.split(r"[\\/]", path) if p][-1] if path.strip("/\\") else path


def without_paths(message):
    """message with every absolute local path cut to …/ and its last part (the file or folder's name)."""
    return ABSOLUTE.sub(_shorten, str(message))
