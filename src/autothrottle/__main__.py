"""``python -m autothrottle``: the ``autothrottle`` command (see :mod:`autothrottle.cli`)."""

from autothrottle.cli import main

raise SystemExit(main())
