"""What a zygote preloads for its workers (node/preload.py), each case in a fresh
interpreter: the zygote's imports are the process's own, which pytest's may already hold."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.torch


def _run(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_worker_with_the_zygotes_environment_keeps_the_preloaded_modules() -> None:
    pytest.importorskip("transformers")
    out = _run("""
        import os, sys
        import torch
        from weave_slurm.node import preload
        added = preload.warm()
        assert "transformers.models.llama.modeling_llama" in added, added
        assert not any(n.partition(".")[0] == "torch" for n in added)
        kept = sys.modules["transformers"]
        os.environ["WEAVE_JOB_ID"] = "7"   # a per-job variable no import reads
        print(preload.settle(), sys.modules["transformers"] is kept, preload.settle())
    """)
    assert out == "False True False"


def test_a_worker_whose_job_sets_another_hf_home_imports_transformers_afresh() -> None:
    pytest.importorskip("transformers")
    out = _run("""
        import os, sys
        import torch
        from weave_slurm.node import preload
        assert preload.warm()
        old = sys.modules["huggingface_hub.constants"].HF_HOME
        os.environ["HF_HOME"] = "/nonexistent/job-hf-home"   # the job's, as a phase sets it
        dropped = preload.settle()
        gone = "transformers" not in sys.modules
        from transformers import LlamaConfig, LlamaForCausalLM   # imported afresh, works
        import huggingface_hub.constants as c
        model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=16))
        size = sum(p.numel() for p in model.parameters())
        print(dropped, gone, old != c.HF_HOME, c.HF_HOME, size > 0)
    """)
    assert out == "True True True /nonexistent/job-hf-home True"


def test_preloading_turned_off_imports_nothing() -> None:
    out = _run("""
        import os, sys
        import torch
        from weave_slurm.node import preload
        first = preload.warm()
        del os.environ["WEAVE_ZYGOTE_PRELOAD"]   # a second call does nothing either
        print(first, preload.warm(), "transformers" in sys.modules, preload.settle())
    """, WEAVE_ZYGOTE_PRELOAD="0")
    assert out == "() () False False"
