"""``python -m engine.cli``: the engine's commands without the app's ``serve``."""

from . import main

raise SystemExit(main())
