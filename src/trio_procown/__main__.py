# `python -m trio_procown`: the `procown` command line (see _cli.py).

from ._cli import main
from ._exit import run_and_exit

if __name__ == "__main__":
    run_and_exit(main)
