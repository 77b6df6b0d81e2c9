"""``python -m autothrottle``: the ``autothrottle`` command (see :mod:`autothrottle._cli`)."""

from autothrottle._cli import main

raise SystemExit(main())
