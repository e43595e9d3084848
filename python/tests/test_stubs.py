"""The type stubs describe the modules as they are: every public name, every parameter."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from hyper_multicore import _native, shmem

PACKAGE = Path(shmem.__file__).resolve().parents[1]


def stub_functions(path: Path) -> dict[str, list[tuple[str, str, bool]]]:
    """Top-level functions of a stub: name -> [(parameter, kind, has default)]."""
    tree = ast.parse(path.read_text())
    functions = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            a = node.args
            params = []
            positional = a.posonlyargs + a.args
            defaults = [False] * (len(positional) - len(a.defaults)) + [True] * len(a.defaults)
            for arg, default in zip(positional, defaults):
                params.append((arg.arg, "positional", default))
            if a.vararg:
                params.append((a.vararg.arg, "var", False))
            for arg, default in zip(a.kwonlyargs, a.kw_defaults):
                params.append((arg.arg, "keyword", default is not None))
            functions[node.name] = params
    return functions


def runtime_params(function) -> list[tuple[str, str, bool]]:
    kinds = {
        inspect.Parameter.POSITIONAL_ONLY: "positional",
        inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
        inspect.Parameter.VAR_POSITIONAL: "var",
        inspect.Parameter.KEYWORD_ONLY: "keyword",
    }
    return [
        (p.name, kinds[p.kind], p.default is not inspect.Parameter.empty)
        for p in inspect.signature(function).parameters.values()
    ]


def _defined_in(value, module) -> bool:
    """Defined by ``module`` or one of its submodules (``shmem`` re-exports ``shmem._lifecycle``
    and its siblings), or a builtin of the extension: a function, or a method bound to one of
    its objects (``shmem.empty`` and ``shmem.free`` are the extension's)."""
    defined = getattr(value, "__module__", module.__name__)
    if defined == _native.__name__:
        return True
    return defined in (module.__name__, "builtins") or defined.startswith(module.__name__ + ".")


@pytest.mark.parametrize(
    "module, stub",
    [(shmem, PACKAGE / "shmem" / "__init__.pyi"), (_native, PACKAGE / "_native.pyi")],
    ids=["shmem", "_native"],
)
def test_stub_functions_match_the_module(module, stub):
    functions = stub_functions(stub)
    public = {
        name
        for name, value in vars(module).items()
        if callable(value)
        and not isinstance(value, type)
        and not name.startswith("_")
        and _defined_in(value, module)
    }
    if module is shmem:
        public &= set(shmem.__all__)
    assert public == set(functions), "stub and module list different functions"
    for name, params in functions.items():
        assert runtime_params(getattr(module, name)) == params, name


def test_every_public_name_is_in_the_stub():
    text = (PACKAGE / "shmem" / "__init__.pyi").read_text()
    for name in shmem.__all__:
        assert name in text, name
        assert getattr(shmem, name) is not None
    for name in ("py.typed", "_native.pyi"):
        assert (PACKAGE / name).exists()


def test_every_public_function_has_a_docstring():
    for name in shmem.__all__:
        value = getattr(shmem, name)
        if callable(value):
            assert inspect.getdoc(value), name
