"""Plugin system: hook specs (:mod:`.hookspecs`), the manager (:mod:`.manager`) and the ``hookimpl`` marker.

Writing a backend: see ``docs/plugin-guide.md``.
"""

from .backend_info import BackendInfo
from .hookspecs import hookspec
from .manager import (ENTRY_POINT_GROUP, ENV_BLOCK, ENV_DISABLE_AUTOLOAD, ENV_PLUGINS, ENV_TRACE,
                      TraceaPluginManager, create_plugin_manager, get_plugin_manager, hookimpl,
                      set_plugin_manager)

__all__ = ["BackendInfo", "ENTRY_POINT_GROUP", "ENV_BLOCK", "ENV_DISABLE_AUTOLOAD", "ENV_PLUGINS", "ENV_TRACE",
           "TraceaPluginManager", "create_plugin_manager", "get_plugin_manager", "hookimpl", "hookspec",
           "set_plugin_manager"]
