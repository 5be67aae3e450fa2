"""The inference service: gateway, model servers and supervisor on Twisted.

Everything importable here stays light: no torch, no model code.  Heavy
imports happen inside the model server once its service is made.
"""

__version__ = "0.16.0"

#: The product name printed by every ``--version``.
PRODUCT = "inference-service"


def version_line() -> str:
    """One line naming the product and its version, for every --version flag."""
    return f"{PRODUCT} {__version__}"
