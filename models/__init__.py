"""Model plugins: one module per model family, found with ``twisted.plugin``.

Each module holds objects providing ``svc.model.api.IModelFactory``.  Modules
here must import nothing heavy at import time (torch is imported in
``build``), because every process imports every module of this package
(``svc.model.api``'s scan).
"""

from twisted.plugin import pluginPackagePaths

__path__.extend(pluginPackagePaths(__name__))
__all__: list[str] = []
