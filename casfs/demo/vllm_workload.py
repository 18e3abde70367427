"""vLLM (CPU build) engine start + generation as a probe of VLLM_CACHE_ROOT and Inductor's cache.

Usage (with the vLLM venv's interpreter; needs only the standard library and vllm):

    python casfs/demo/vllm_workload.py --make-model DIR      # tiny random Llama, locally
    python casfs/demo/vllm_workload.py --model DIR --json    # engine start + 8 tokens

There is no model hub: ``--make-model`` builds a 2-layer Llama (hidden 64,
one head, vocab 512) with random weights and ``save_pretrained``. The engine
runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so vLLM's and torch's
own counters are readable here: ``compilation_counter`` (vLLM) and
``torch._dynamo.utils.counters`` (FX-graph and AOTAutograd cache hits and
misses). Prints one JSON line: tokens, engine seconds, those counters.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def make_model(path: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                      max_position_embeddings=256)
    LlamaForCausalLM(cfg).save_pretrained(path)


def generate(model: str) -> dict[str, Any]:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    t0 = time.monotonic()
    from torch._dynamo.utils import counters
    from vllm import LLM, SamplingParams
    from vllm.compilation.counter import compilation_counter
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, skip_tokenizer_init=True, max_model_len=128, max_num_seqs=4,
              dtype="float32", gpu_memory_utilization=0.08)
    engine_s = time.monotonic() - t0
    params = SamplingParams(max_tokens=8, temperature=0.0, detokenize=False)
    out = llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3, 4, 5])], params)
    vllm_counts = {k: v for k, v in vars(compilation_counter).items() if isinstance(v, int)}
    torch_counts = {f"{group}.{k}": int(v) for group in ("inductor", "aot_autograd")
                    for k, v in counters[group].items() if "cache" in k}
    return {"tokens": list(out[0].outputs[0].token_ids), "engine_s": round(engine_s, 2),
            "vllm": vllm_counts, "torch": torch_counts}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--make-model", metavar="DIR")
    p.add_argument("--model", metavar="DIR")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.make_model:
        make_model(args.make_model)
        return 0
    if not args.model:
        p.error("--model DIR or --make-model DIR")
    print(json.dumps(generate(args.model)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
