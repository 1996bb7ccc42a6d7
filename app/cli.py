"""The ``soapbox`` command: the engine's commands plus ``serve`` (the web app)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from engine.cli import main as engine_main

__all__ = ["main"]


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0 for all; default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8050, help="port (default 8050)")
    p.add_argument("--debug", action="store_true", help="Dash debug mode (reloads on code changes)")


def _serve(args: argparse.Namespace) -> int:
    from . import create_app
    from .callbacks import warm_up

    app = create_app()
    warm_up()
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    print(f"soapbox explorer: http://{shown}:{args.port}/  (Ctrl+C to stop)", flush=True)
    app.run(host=args.host, port=args.port, debug=args.debug)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return engine_main(argv, extra={"serve": ("run the web explorer (Dash)", _serve_args, _serve)})


if __name__ == "__main__":
    sys.exit(main())
