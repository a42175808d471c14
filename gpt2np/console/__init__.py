"""python -m gpt2np.console: an interactive console over the public API (outer ring).

    repl.py      the loop: prompts in, tokens streamed out, commands
    commands.py  parsing the console's commands and settings
    slash.py     the '/' commands (romsto/Speculative-Decoding's names) as ':' commands
    flags.py     the command line and the settings it starts with
    runs.py      starting plain, speculative and cache-free runs
    display.py   traces and speedup tables

May import gpt2np's public API and report.py; never teach.
"""
