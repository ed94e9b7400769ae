"""The type stubs (_psclient.pyi) name what the extension module has, and
nothing it lacks: every public name and every public method on both sides."""

import ast
import pathlib

import psclient
from psclient import _psclient


def stub_names():
    path = pathlib.Path(psclient.__file__).with_name("_psclient.pyi")
    tree = ast.parse(path.read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("_"):
            continue  # the stubs' own helpers (_PybindEnum)
        if isinstance(node, ast.ClassDef):
            names[node.name] = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AnnAssign))
                                and not getattr(n, "name", "_").startswith("_")} | \
                               {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)} | \
                               {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets
                                if isinstance(t, ast.Name)}
        elif isinstance(node, ast.FunctionDef):
            names[node.name] = None
    return names


def test_every_stub_name_exists_and_every_public_name_has_a_stub():
    stubs = stub_names()
    module = {n for n in dir(_psclient) if not n.startswith("_")}
    assert sorted(set(stubs) - module) == []  # stubbed, not in the module
    assert sorted(module - set(stubs)) == []  # in the module, not stubbed
    for name, members in stubs.items():
        if members is None:
            continue
        cls = getattr(_psclient, name)
        assert sorted(m for m in members if not hasattr(cls, m)) == [], name
        if name in ("Client", "TableSpec", "RowOptimizerConfig", "TableInfo"):
            public = {m for m in dir(cls) if not m.startswith("_")}
            assert sorted(public - members) == [], name  # bound but not stubbed


def test_enums_are_stubbed_as_what_they_are():
    # pybind11 enums, not enum.Enum (a type checker accepted list(SyncMode), which raises): the stubs
    # say so, and what they promise (name, value, __members__) works.
    path = pathlib.Path(psclient.__file__).with_name("_psclient.pyi")
    bases = {node.name: [ast.unparse(b) for b in node.bases]
             for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef)}
    enums = [name for name in bases if isinstance(getattr(_psclient, name, None), type)
             and hasattr(getattr(_psclient, name), "__members__")]
    assert len(enums) >= 6, enums
    for name in enums:
        assert bases[name] == ["_PybindEnum"], (name, bases[name])
    assert not issubclass(psclient.SyncMode, __import__("enum").Enum)
    for enum_type in (psclient.SyncMode, psclient.PushStatus, psclient.OptimizerKind):
        for name, member in enum_type.__members__.items():
            assert member.name == name and enum_type(member.value) == member and int(member) == member.value

