"""python -m gpt2np.console: the console's command (its loop is repl.py)."""
import sys

try:  # Ctrl-C while NumPy and the package load: exit 130, as at the prompt, no traceback
    from .repl import main
    from ..report import run_command
except KeyboardInterrupt:
    sys.exit(130)


def run():
    """main() as a command (report.run_command): a closed pipe ends it quietly, a closed or full stdout is
    one line on stderr (status 2), Ctrl-C at the prompt ends the prompt's line on stderr (status 130)."""
    sys.exit(run_command(console))


def console():
    try:
        return main()
    except KeyboardInterrupt:  # Ctrl-C at the prompt (during a run it only stops the run)
        print(file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    run()
