"""pytest collects gpt2np/ for its doctests; the server subpackage needs FastAPI, which only
requirements-serve.txt (and so requirements-dev.txt) installs: without it, leave it out."""
import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("fastapi") and importlib.util.find_spec("uvicorn") \
    else ["gpt2np/serve/*"]
