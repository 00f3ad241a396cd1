"""What a stage package exports, read on first use (PEP 562): importing one module of a package (the command
line's `training.cli`, say) does not import every module its package exports from."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module


def lazy_exports(package: str, public: Mapping[str, str | tuple[str, str]]) -> Callable[[str], object]:
    """The package's `__getattr__`: `public` maps each exported name to the module (relative to `package`) that
    defines it, or to (module, the name there) where the export is renamed."""

    def __getattr__(name: str):
        if name not in public:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = public[name] if isinstance(public[name], tuple) else (public[name], name)
        return getattr(import_module(f".{module}", package), attribute)

    return __getattr__
