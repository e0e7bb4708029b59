"""Entry point: ``python3 BUNDLE/install [options]`` (the shipped copy, run by install.sh) or
``python -m pdsvc.ship.install``.

Run as a directory, Python puts that directory itself on ``sys.path`` and runs this file as a
top-level script. Its modules are a package (relative imports), so put the directory's parent
on the path instead and import the package by the directory's name (runpy, PEP 338/441).
"""

import importlib
import os
import sys

# no __pycache__/ in the bundle it runs from (a checkout's units/, a copied bundle)
sys.dont_write_bytecode = True
if __package__:
    from .cli import main
else:
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[0] = os.path.dirname(_here)
    main = importlib.import_module(os.path.basename(_here) + ".cli").main

sys.exit(main())
