"""Test support: put on PYTHONPATH when the serve venv runs sglang.bench_serving.

The test venv (tests/support/make_serve_venv.sh) holds SGLang without its GPU stack. Two
imports on bench_serving's way need that stack, for nothing a benchmark client does:

* every ``sglang.*`` import runs sglang/__init__.py, which imports sglang/srt/utils/common.py,
  which imports ``triton`` at module level: argv_check.py's stub module stands in;
* sglang/benchmark/serving.py imports ``FAKE_BOOTSTRAP_HOST`` (a constant, for
  ``--fake-prefill``) from sglang/srt/disaggregation/utils.py, which imports the model configs
  and with them torchvision (a CUDA build on PyPI): a module holding only that constant,
  with the value sglang 0.5.23 defines there, stands in.

A GPU host's SGLang venv has the real triton and torchvision and needs none of this.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_pdsvc_argv_check", Path(__file__).resolve().parent.parent / "argv_check.py")
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _module  # dataclasses look their module up there
    _spec.loader.exec_module(_module)
    _module.install_triton_stub()

_DISAGG_UTILS = "sglang.srt.disaggregation.utils"


class _DisaggConstants(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):  # noqa: ANN001, ANN201
        if fullname == _DISAGG_UTILS:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # type: ignore[attr-defined]


sys.meta_path.insert(0, _DisaggConstants())
