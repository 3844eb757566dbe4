"""Reading the installed lfx and Langflow without importing them: a file's text, a function's node.

``reach`` (which paths reach the executor) and ``hostbuild`` (the hook's fingerprint, and what
``doctor`` says of it) read the same sources the same way: located with ``importlib.util.find_spec``
(no import), parsed with :mod:`ast`, never run.
"""

from __future__ import annotations

import ast
import importlib.util
import os

__all__ = ["function", "source"]


def source(package: str, relative: str) -> tuple[str | None, str]:
    """The text of ``relative`` inside the installed ``package`` (located without importing it)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None, f"{package} is not installed"
    for root in spec.submodule_search_locations:
        path = os.path.join(root, relative)
        try:
            with open(path, encoding="utf-8") as f:
                return f.read(), path
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:  # unreadable, or not UTF-8
            return None, f"{package}/{relative} could not be read ({type(exc).__name__})"
    return None, f"{package}/{relative} was not found"


def function(tree: ast.AST, qualname: str) -> ast.AST | None:
    """The (async) function ``qualname`` (``Class.method`` or ``function``) in ``tree``."""
    node: ast.AST | None = tree
    for part in qualname.split("."):
        found = None
        for child in ast.iter_child_nodes(node) if node is not None else ():
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == part:
                found = child
                break
        node = found
    return node
