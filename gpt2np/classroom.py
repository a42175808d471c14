"""python -m gpt2np.classroom: the classroom command (its experiments are teach/classroom.py)."""
import sys

from .report import run_command
from .teach.classroom import main


def run(argv=None):
    """main() as a command (report.run_command): Ctrl-C is status 130 and a closed pipe (`| head`) 0, never a
    traceback, as every other command."""
    sys.exit(run_command(main, argv))


if __name__ == "__main__":
    run()
