"""Which versions of the packages the units import are installed, asked of runtime.python.

Run by the SGLang venv's interpreter, not by pdsvc, as
``PY -I versions.py pdsvc-doctor-versions JSON`` where JSON is
``{label: {"dists": [distribution names], "module": "import name"}}``. Prints one line,
``pdsvc-doctor-result {"python", "executable", "versions": {label: version or null}}``.
Standard library only, Python >= 3.9.
"""

import importlib.metadata as md
import importlib.util
import json
import platform
import sys

RESULT_PREFIX = "pdsvc-doctor-result "


def installed(dists, module):
    """The first of ``dists`` installed, else a note when ``module`` imports anyway."""
    for dist in dists:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            pass
    if importlib.util.find_spec(module) is not None:
        return "(importable, version unknown)"
    return None


def main():
    wanted = json.loads(sys.argv[-1])
    found = {label: installed(spec["dists"], spec["module"]) for label, spec in wanted.items()}
    answer = {"python": platform.python_version(), "executable": sys.executable,
              "versions": found}
    print(RESULT_PREFIX + json.dumps(answer))


if __name__ == "__main__":
    main()
