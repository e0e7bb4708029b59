"""pdsvc's runtime: the main process of every rendered unit (it runs and watches one SGLang
engine or the router), and the supervisord event listener.

Standard library only, Python >= 3.9: it is shipped as plain files beside the rendered units and
runs under the SGLang venv's interpreter on the GPU host (``python DIR/runtime engine ...``, a
directory with ``__main__.py``). `pdsvc doctor` and `pdsvc status` import the same modules.
One idea a module:

  notify     sd_notify and log lines          probe      the HTTP client for every probe
  gpu        the nvidia-smi client            jitlock    cold JIT compile serialisation
  proctree   subreaper and /proc              child      the supervised command
  phases     start / liveness / peer loops    lifecycle  one unit's life, start to exit
  listener   supervisord's event listener     cli        the command line
  states     the states and their transitions
"""
