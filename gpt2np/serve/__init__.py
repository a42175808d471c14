"""gpt2np over HTTP: an OpenAI-compatible completions server and a web playground.

    python -m gpt2np.serve                       # the bundled Shakespeare pair on 127.0.0.1:8000

engine.py owns the models and runs one generation at a time from a bounded queue; app.py is the
FastAPI application (`create_app(engine)`); completions.py shapes OpenAI's response objects and
server-sent events; static/index.html is the playground. Only this subpackage imports FastAPI
(requirements-serve.txt): `import gpt2np` and `python main.py` never need it.
"""
