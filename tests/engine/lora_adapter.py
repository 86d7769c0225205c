"""A small LoRA adapter for the default model, built locally (nothing can be downloaded).

The adapter is PEFT's format — ``adapter_config.json`` and ``adapter_model.safetensors``
with ``lora_A``/``lora_B`` matrices on every layer's ``q_proj`` and ``v_proj`` — as vLLM
loads any PEFT adapter. Its weights are seeded noise: it is not trained for anything, it
only has to change what the model says, so a test can tell whether it was applied.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["write_lora_adapter"]


def write_lora_adapter(model_dir: Path, out: Path, *, rank: int = 8, seed: int = 0) -> Path:
    """Write an adapter for the model in ``model_dir`` to ``out`` and return ``out``."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((model_dir / "config.json").read_text())
    hidden = int(config["hidden_size"])
    head_dim = hidden // int(config["num_attention_heads"])
    kv_out = head_dim * int(config["num_key_value_heads"])
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(int(config["num_hidden_layers"])):
        for module, out_features in (("q_proj", hidden), ("v_proj", kv_out)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = 0.1 * torch.randn(
                rank, hidden, generator=generator
            )
            tensors[f"{prefix}.lora_B.weight"] = 0.2 * torch.randn(
                out_features, rank, generator=generator
            )
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": ["q_proj", "v_proj"],
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return out
