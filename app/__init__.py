"""The soapbox explorer: a Dash app over :mod:`engine` (the engine never imports it).

``create_app()`` builds the app; ``soapbox serve`` runs it. Session state lives in the page's
``dcc.Store`` (see :mod:`app.workspace`); views are pure figure builders (:mod:`app.figures`)
over view data (:mod:`app.views`); callbacks are plain functions (:mod:`app.callbacks`).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["create_app"]

ASSETS = Path(__file__).parent / "assets"


def create_app():
    """The Dash app, with its layout and callbacks (one instance serves many sessions; each
    browser tab has its own state)."""
    from dash import Dash

    from .callbacks import register
    from .layout import make_layout

    app = Dash(__name__, title="soapbox", assets_folder=str(ASSETS), suppress_callback_exceptions=False,
               update_title=None)
    app.layout = make_layout
    register(app)
    return app
