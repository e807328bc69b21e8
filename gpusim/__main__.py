"""``python -m gpusim``: the ``gpusim`` command (:func:`gpusim.cli.main`)."""

import sys

from gpusim.cli import main

if __name__ == "__main__":
    sys.exit(main())
