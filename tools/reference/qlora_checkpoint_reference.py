#!/tmp/venv/bin/python
"""A checkpoint Transformers saved from a model loaded in 4 bits, for
tests/test_qlora_checkpoint.c: regc reads it as the NF4 base it holds.

NOT part of the test suite and not run by it: it needs torch 2.x,
transformers and bitsandbytes (see lora_reference.py), so run it by hand in
a virtual environment that has them:

    /tmp/venv/bin/python tools/reference/qlora_checkpoint_reference.py

The base is tests/data/lora_reference.json's "qlora_cases"[0]["base"], the
tiny Llama the QLoRA cases train (tests/support/test_train_case.c rebuilds
its fp32 directory from that record). It is written as a Hugging Face
directory (lora_reference.write_base_dir), loaded in 4 bits as a QLoRA user
loads it (lora_reference.build_qlora_base: BitsAndBytesConfig with nf4,
double quantisation, compute in float32, on the CPU) and saved with
save_pretrained. tests/data/qlora_checkpoint/ keeps its config.json (with
"quantization_config") and model.safetensors (each quantised Linear's
weight as U8 packed values, .absmax, .nested_absmax, .quant_map,
.nested_quant_map and .quant_state.bitsandbytes__nf4); the test trains it
against the fp32 base with --load-in-4bit on, which must hold the same
bytes.
"""

import json
import os
import shutil
import tempfile

import safetensors

import lora_reference

REPO = lora_reference.REPO
OUT = os.path.join(REPO, "tests/data/qlora_checkpoint")
KEEP = ("config.json", "model.safetensors")  # generation_config.json is not read


def main():
    with open(os.path.join(REPO, "tests/data/lora_reference.json")) as f:
        base = json.load(f)["qlora_cases"][0]["base"]
    tmp = tempfile.mkdtemp(prefix="qlora_checkpoint_")
    try:
        fp32, q4 = os.path.join(tmp, "fp32"), os.path.join(tmp, "q4")
        lora_reference.write_base_dir(base, fp32)
        lora_reference.build_qlora_base(base, fp32).save_pretrained(q4)
        os.makedirs(OUT, exist_ok=True)
        for name in KEEP:
            shutil.copyfile(os.path.join(q4, name), os.path.join(OUT, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with safetensors.safe_open(os.path.join(OUT, "model.safetensors"), "np") as f:
        names = list(f.keys())
    quantised = [n for n in names if n.endswith(".quant_state.bitsandbytes__nf4")]
    print("%s: %d tensors, %d weights in NF4, %d bytes" %
          (OUT, len(names), len(quantised),
           sum(os.path.getsize(os.path.join(OUT, n)) for n in KEEP)))


if __name__ == "__main__":
    main()
