"""The `kfuse` console script: the CLI binary built with the package
(bin/kfuse beside this file), run with the same arguments."""

import os
import sys


def binary():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "kfuse")


def main():
    path = binary()
    if not os.access(path, os.X_OK):
        sys.stderr.write("kfuse: the CLI is not installed at %s (reinstall with `pip install .`)\n" % path)
        return 2
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
