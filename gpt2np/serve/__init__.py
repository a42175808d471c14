"""gpt2np over HTTP: an OpenAI-compatible completions server and a web playground.

    python -m gpt2np.serve                       # the bundled Shakespeare pair on 127.0.0.1:8000

engine.py owns the models in one worker thread that takes generations from a bounded queue and runs
up to --max_batch of them at once (continuous batching: jobs join and leave at step boundaries;
--max_batch 1 runs one at a time); jobs.py holds what the engine works with (a checked request, its
job, its statistics, the request errors); app.py is the FastAPI application (`create_app(engine)`);
schemas.py checks the request bodies (pydantic); completions.py shapes OpenAI's response objects and
server-sent events; names.py shows models by name, never by local path; __main__.py is the command
line; static/index.html is the playground. Only this subpackage imports FastAPI
(requirements-serve.txt): `import gpt2np` and `python main.py` never need it.
"""
