# `python -m trio_procown`: the `procown` command line (see _cli.py).

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
