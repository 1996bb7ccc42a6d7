"""The page's tabs, each a module with its layout (``layout()``), the plain functions its
callbacks call (tests call them directly) and ``register(app)``, which wires them (Dash's
page habit: what a view shows and what redraws it live together)."""
