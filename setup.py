"""The packages of the wheel, found rather than listed (pyproject.toml holds everything else).

setuptools finds every ``pdsvc*`` package itself, so a new one can never be left out of what
users install. The templates live at the top level (``templates/``) and ship inside the package
as ``pdsvc.templates`` (``package-dir`` in pyproject.toml maps it), their folders found the same
way. ``tests/test_wheel.py`` builds the wheel and fails on any file of ``pdsvc/`` it lacks.
"""

from setuptools import find_namespace_packages, find_packages, setup

TEMPLATE_DIRS = find_namespace_packages("templates", exclude=["*__pycache__*"])
TEMPLATES = ["pdsvc.templates", *(f"pdsvc.templates.{d}" for d in TEMPLATE_DIRS)]

setup(packages=[*find_packages(include=["pdsvc", "pdsvc.*"]), *TEMPLATES])
