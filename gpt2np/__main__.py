"""python -m gpt2np: main.py's command (gpt2np/cli/), for an installed gpt2np, which has no main.py (the
`gpt2np` command is the same)."""
from .cli import run

if __name__ == "__main__":
    run()
