"""TOML, read with the standard library's parser (tomllib, Python 3.11) or, on Python 3.10, the
same parser as the tomli package (a dependency there)."""

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

__all__ = ["tomllib"]
