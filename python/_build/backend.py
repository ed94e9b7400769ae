"""Build backend for `pip install ./python`: meson-python over the whole project.

The bindings need libpsclient's sources, which live above python/, and a Meson
project is configured from its top directory; so this runs meson-python's own
backend with the repository's top as Meson's source directory, while
pyproject.toml (here) gives the package's metadata and Meson arguments.
"""

import pathlib

import mesonpy
from mesonpy import *  # noqa: F401,F403  (the hooks pip calls)

TOP = pathlib.Path(__file__).resolve().parents[2]


class _Project(mesonpy.Project):
    def _configure(self, reconfigure=False):
        here = self._source_dir
        self._source_dir = TOP
        try:
            super()._configure(reconfigure=reconfigure)
        finally:
            self._source_dir = here


mesonpy.Project = _Project  # what mesonpy's hooks construct
