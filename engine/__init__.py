"""soapbox's engine: pure Python and NumPy (numba for the event loop); it never imports the app.

The packages follow the data flow, bottom to top (a package imports only those below it;
``tests/test_layers.py`` checks it): ``ops`` (the operator catalogue) and ``graph`` (models as
operators and tensors), ``cluster`` (devices and links), ``costs`` (how long a kernel, a
transfer or a collective takes), ``strategy`` (how every op is split and placed), ``layout``
(the one framework layout record and its builder), ``models`` and ``formats`` (builders,
importers, files), ``taskgraph`` (a strategy as tasks), ``sim`` (simulating them), ``search``,
``export``, ``studies``, ``experiments`` (a one-way wing) and ``cli``. Beside them only the
vocabulary every package speaks: :mod:`engine.errors` (errors a user can act on) and
:mod:`engine.moe` (mixture-of-experts routing).
"""
