"""Public names that say where to import them from, as httpx's do."""

from __future__ import annotations

import inspect
import sys
import typing
from collections.abc import Iterable


def _private_below(module: str, face: str) -> bool:
    return module.startswith(face + ".") and any(
        part.startswith("_") for part in module[len(face) + 1:].split("."))


def _resolve_annotations(cls: type, face: str) -> None:
    """Evaluate `cls`'s own postponed annotations in the module that wrote them (and the
    face, for names it imports only while type checking), so msgspec and
    typing.get_type_hints still read them once `__module__` names the face. One that names
    nothing at run time stays a string, as unreadable as before."""
    own = inspect.get_annotations(cls)
    if not own or not any(isinstance(value, (str, typing.ForwardRef)) for value in own.values()):
        return
    namespace = {**vars(sys.modules[face]), **vars(sys.modules[cls.__module__])}
    resolved = dict(own)
    for name, value in own.items():
        if isinstance(value, (str, typing.ForwardRef)):
            ref = typing.ForwardRef(value, is_class=True) if isinstance(value, str) else value
            try:
                resolved[name] = typing._eval_type(  # type: ignore[attr-defined]
                    ref, namespace, dict(vars(cls)), frozenset())
            except NameError:
                continue
    type.__setattr__(cls, "__annotations__", resolved)


def publish_face(face: str, names: Iterable[str] | None = None) -> None:
    """Make each class and function in the `__all__` of the package `face` (or of `names`)
    that is defined in a private module below it report `face` as its `__module__` (in
    reprs, tracebacks, docs and pickles): the place to import it from. Call it last in the
    face's `__init__` (a face that loads names when first asked for publishes each then)."""
    module = sys.modules[face]
    for name in getattr(module, "__all__", ()) if names is None else names:
        obj = getattr(module, name)
        if not isinstance(obj, type) and not callable(obj):
            continue
        home = getattr(obj, "__module__", None)
        if not isinstance(home, str) or not _private_below(home, face):
            continue
        if isinstance(obj, type):
            _resolve_annotations(obj, face)
            type.__setattr__(obj, "__module__", face)
        else:
            try:
                obj.__module__ = face
            except (AttributeError, TypeError):
                continue  # a builtin or a partial: it keeps the module it has
