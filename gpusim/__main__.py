"""``python -m gpusim``: the ``gpusim`` command (:func:`gpusim.cli.main`)."""

import sys

from gpusim.cli import main

sys.exit(main())
