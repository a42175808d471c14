"""python -m gpt2np.console: the console's command (its loop is repl.py)."""
import os
import sys

try:  # Ctrl-C while NumPy and the package load: exit 130, as at the prompt, no traceback
    from .repl import main
except KeyboardInterrupt:
    sys.exit(130)


def run():
    """main() as a command: Ctrl-C at the prompt and a closed pipe end it quietly."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C at the prompt (during a run it only stops the run)
        print(file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # the reader left: nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


if __name__ == "__main__":
    run()
