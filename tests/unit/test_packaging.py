"""The distribution maps services/, schemas/ and streams/ under one `coevolve` namespace."""
import importlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAPPING = {"services": "coevolve.services", "schemas": "coevolve.schemas", "streams": "coevolve.streams"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_python_package_folder_is_listed_for_the_wheel():
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = set()
    for folder, namespace in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((namespace, *rel)))
    assert found == listed


def test_no_bare_top_level_package_is_installed():
    dirs = _pyproject()["tool"]["setuptools"]["package-dir"]
    assert dirs == {v: k for k, v in MAPPING.items()}
    for namespace in MAPPING.values():
        module = importlib.import_module(namespace)
        assert Path(module.__file__).parent.name in MAPPING


def test_schema_files_ship_as_package_data():
    data = _pyproject()["tool"]["setuptools"]["package-data"]["coevolve.schemas"]
    assert "*.avsc" in data
