"""soapbox's engine: pure Python and NumPy (numba for the event loop); it never imports the app.

The packages follow the data flow, bottom to top (a package imports only those below it;
``tests/test_layers.py`` checks it): ``ops`` (the operator catalogue) and ``graph`` (models as
operators and tensors), ``cluster`` (devices and links), ``costs`` (how long a kernel, a
transfer or a collective takes), ``strategy`` (how every op is split and placed), ``layout``
(the one framework layout record and its builder), ``models`` and ``formats`` (builders,
importers, files), ``taskgraph`` (a strategy as tasks), ``sim`` (simulating them), ``export``
(what a framework takes: the layout search asks it), ``search``, ``studies``, ``experiments``
(a one-way wing) and ``cli``. Beside them only the vocabulary every package speaks: :mod:`engine.errors` (errors a user can act on) and
:mod:`engine.moe` (mixture-of-experts routing).
"""

import os as _os
import sys as _sys


def _numba_cache_outside_the_package() -> None:
    """Point numba's on-disk cache (``@njit(cache=True)``) at the user's cache folder, e.g.
    ``~/.cache/soapbox/numba``, unless ``NUMBA_CACHE_DIR`` is set already.

    Left to itself numba writes ``__pycache__/*.nbi``/``*.nbc`` beside the installed modules;
    pip does not know those files, so replacing a ``pip install .`` by ``pip install -e .``
    leaves ``site-packages/engine/`` holding only them, and Python then imports that folder as
    a namespace package in place of the editable checkout (``cannot import name 'BWD' from
    'engine.taskgraph'``: issue 44). numba reads the variable when it is first imported; if it
    was imported before us, its config is set directly (it is read when a cache is made).
    """
    if _os.environ.get("NUMBA_CACHE_DIR"):
        return
    try:
        from platformdirs import user_cache_dir
        folder = _os.path.join(user_cache_dir("soapbox"), "numba")
    except ImportError:  # platformdirs is a dependency; this is a last resort
        folder = _os.path.join(_os.path.expanduser("~"), ".cache", "soapbox", "numba")
    _os.environ["NUMBA_CACHE_DIR"] = folder
    config = getattr(_sys.modules.get("numba"), "config", None)
    if config is not None and not getattr(config, "CACHE_DIR", ""):
        config.CACHE_DIR = folder


_numba_cache_outside_the_package()
