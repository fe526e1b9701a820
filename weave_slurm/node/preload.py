"""What a zygote imports once for the workers it forks, beyond torch, and when a worker
must import it again itself.

A resident worker of the built-in jobs builds its policy with transformers' Llama
classes (workloads/grpo_model.py). Imported in the worker, that costs about as much CPU
as importing torch again (4 s against 2 s on the CI machine: transformers reads its
whole model index first), once per worker, and a node starts a worker per role, rank and
engine of every member. The zygote imports them once, before its first fork
(:func:`warm`; a zygote that forks nothing imports nothing more), and every fork
inherits them.

Two limits keep a preloaded module from being one the job would not have imported:

- **The import-time environment.** huggingface_hub and transformers read their cache
  paths, offline switch and the like from the environment when they are imported, and
  a zygote forks workers of jobs with other environments and other home directories.
  :func:`warm` notes those variables (:data:`IMPORT_ENV`, the ``~`` the cache paths
  expand, as the job's uid sees it after the fork); a worker whose first phase runs
  with any of them different drops the preloaded Python modules (:func:`settle`) and
  imports them afresh, as without a zygote. Compiled extension modules stay loaded: a
  second initialisation of some (PyO3's) fails, and they read no environment.
- **CUDA.** On a torch built with CUDA or ROCm nothing is preloaded: an import that
  asks the driver for its devices before a fork would leave the forked workers unable
  to use CUDA, and a zygote must never touch the GPU.

``WEAVE_ZYGOTE_PRELOAD=0`` in the node daemon's environment turns preloading off.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

#: The modules a zygote preloads, and the names it reads from them (a lazy package
#: imports a name's module only when it is read).
PRELOAD: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("transformers", ("LlamaConfig", "LlamaForCausalLM")),
)
#: Environment variables (exact names, or prefixes ending in "_") read at import time
#: by the preloaded packages.
IMPORT_ENV: tuple[str, ...] = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_",
                               "SAFETENSORS_", "ACCELERATE_", "PYTORCH_", "USE_",
                               "XDG_CACHE_HOME", "DISABLE_SAFETENSORS_CONVERSION")
OFF_ENV = "WEAVE_ZYGOTE_PRELOAD"

#: What :func:`warm` loaded in this process (inherited by forks), and the environment
#: it saw; None: nothing preloaded.
_loaded: tuple[str, ...] = ()
_seen: dict[str, str] | None = None
_tried = False


def import_env() -> dict[str, str]:
    """The part of this process's environment the preloaded packages read when
    imported, with ``~`` as its user expands it."""
    out = {k: v for k, v in os.environ.items()
           if k.startswith(tuple(p for p in IMPORT_ENV if p.endswith("_"))) or k in IMPORT_ENV}
    out["~"] = os.path.expanduser("~")
    return out


def gpu_build() -> bool:
    """Whether this torch was built with CUDA or ROCm (then nothing is preloaded)."""
    import torch

    return torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None


def warm() -> tuple[str, ...]:
    """Import :data:`PRELOAD` where installed (not on a GPU build, not when turned off);
    returns the modules it added. Only the first call in a process (or the process it
    was forked from) imports anything."""
    global _loaded, _seen, _tried
    if _tried:
        return ()
    _tried = True
    if os.environ.get(OFF_ENV) == "0" or gpu_build():
        return ()
    before = set(sys.modules)
    tops = {n.partition(".")[0] for n in before} | set(sys.stdlib_module_names)
    for name, attrs in PRELOAD:
        if importlib.util.find_spec(name) is None:
            continue
        module = importlib.import_module(name)
        for attr in attrs:
            getattr(module, attr)
    # the packages they brought (torch's submodules they imported stay, as torch does)
    _loaded = tuple(sorted(n for n in set(sys.modules) - before
                           if n.partition(".")[0] not in tops))
    _seen = import_env() if _loaded else None
    return _loaded


def settle() -> bool:
    """In a forked worker, once its phase's environment is set: keep what the zygote
    preloaded if it was imported with the same import environment, else drop its Python
    modules so the job imports them afresh. Returns True when they were dropped; later
    calls do nothing."""
    global _loaded, _seen
    if _seen is None:
        return False
    same = import_env() == _seen
    dropped = () if same else _loaded
    for name in dropped:
        module = sys.modules.get(name)
        if module is not None and _python_module(module):
            del sys.modules[name]
    _loaded, _seen = (), None
    if dropped:
        importlib.invalidate_caches()
    return bool(dropped)


def _python_module(module: object) -> bool:
    """A module of Python source (not a compiled extension, which stays loaded)."""
    path = getattr(module, "__file__", None) or ""
    return not path.endswith((".so", ".pyd"))
