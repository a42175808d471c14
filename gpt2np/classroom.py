"""python -m gpt2np.classroom: the classroom command (its experiments are teach/classroom.py)."""
import sys

from .teach.classroom import main


def run():
    sys.exit(main())


if __name__ == "__main__":
    run()
