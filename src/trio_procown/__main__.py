# `python -m trio_procown`: the `procown` command line (see _cli.py, and
# _entry.py for the signals that come before it can relay them).

from ._entry import procown

if __name__ == "__main__":
    procown()
