"""The soapbox web app (Dash over :mod:`engine`); it lands with the explorer (issue 5).

Until then the package holds nothing: the engine and its CLI are the product.
"""
