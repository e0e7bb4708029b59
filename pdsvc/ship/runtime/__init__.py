"""pdsvc's runtime: the main process of every rendered unit (it runs and watches one SGLang
engine or the router), and the supervisord event listener.

Standard library only, Python >= 3.9: it is shipped as plain files beside the rendered units and
runs under the SGLang venv's interpreter on the GPU host (``python DIR/runtime engine ...``, a
directory with ``__main__.py``). `pdsvc doctor` and `pdsvc status` import the same modules.
One idea a module:

  cli        the command line                 options    every option and its default
  lifecycle  one unit's life, start to exit   states     the states and their transitions
  serving    SERVING's duties                 stopping   STOPPING and the exit status
  endings    how a run ends, exit statuses    timings    every fixed timing
  phases     the waits before SERVING, peers  policy     the restart policy, heal budget
  events     SERVING's events and pollers     watch      SERVING's decisions: a pure step
  canary     the pair canary's judgment       rounds     the canary's rounds and thread
  cascade    heal cascades and their cure     membership the router's worker list
  hold       pdsvc apply's and profile's hold statefile  the state files' contract
  profiled   a profile hold: liveness excused, the routers' health checks paused
  duties     a duty's thread that raises: said, counted, and its policy
  metrics    the node_exporter textfile       probe      the HTTP client for every probe
  notify     sd_notify and log lines          gpu        the nvidia-smi client
  jitlock    cold JIT compile serialisation   proctree   subreaper and /proc
  child      the supervised command           listener   supervisord's event listener
  launch     the router launcher with its key fleet      heals and cures across hosts
  front      a router in and out of HAProxy   leaving    a stop's leave, bounded; ExecStopPost's
  waiting    waits that see a stop at once: a call aside, a pause in slices

docs/lifecycle.md and its pages tell the whole story by state, with a timeline per fault
(docs/lifecycle/faults.md).
"""
