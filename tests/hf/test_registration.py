"""The auto classes know the model after `import transformer_vq.hf`, whichever of it and transformers is imported
first, with no trust_remote_code; `import transformer_vq` itself loads neither torch nor transformers and registers
nothing (no import hooks, no side effects)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]

LOAD = """
import torch
from transformers import AutoModel, AutoModelForCausalLM
for auto in (AutoModelForCausalLM, AutoModel):
    model = auto.from_pretrained({path!r})
    print(type(model).__name__, float(model(torch.tensor([[1, 2, 3]])).logits.sum().detach()))
"""


def python(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, float]:
    import torch

    from hfutil import tiny_model
    from transformer_vq.hf import TransformerVQForCausalLM

    path = tmp_path_factory.mktemp("hf")
    lib = tiny_model()
    TransformerVQForCausalLM.from_library_model(lib).save_pretrained(path)
    return path, float(lib(torch.tensor([[1, 2, 3]])).logits.sum().detach())


@pytest.mark.parametrize("imports", ["import transformer_vq.hf; import transformers",
                                     "import transformers; import transformer_vq.hf"],
                         ids=["transformer_vq-first", "transformers-first"])
def test_auto_classes_load_in_either_import_order(saved, imports):
    path, logit_sum = saved
    words = python(imports + LOAD.format(path=str(path)))
    assert words[0::2] == ["TransformerVQForCausalLM", "TransformerVQForCausalLM"]
    assert [float(w) for w in words[1::2]] == [logit_sum, logit_sum]


def test_import_transformer_vq_stays_light():
    assert python("import sys, transformer_vq; print('torch' in sys.modules, 'transformers' in sys.modules)") \
        == ["False", "False"]


def test_import_transformer_vq_registers_nothing():
    assert python("import sys, transformer_vq, transformers\n"
                  "from transformers.models.auto.configuration_auto import CONFIG_MAPPING\n"
                  "print('transformer_vq' in CONFIG_MAPPING, "
                  "[m for m in sys.modules if m.startswith('transformer_vq.')])"
                  ) == ["False", "[]"]
