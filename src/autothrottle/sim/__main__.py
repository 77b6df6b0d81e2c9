"""``python -m autothrottle.sim``: see :func:`autothrottle.sim.main`."""

from autothrottle.sim import main

raise SystemExit(main())
