"""Loads a folder written by `iota export --hf` with Hugging Face `transformers` and reports,
as JSON, what tests/export_hf.rs compares with iota's own figures.

Usage: python check.py MODEL_DIR INPUT.json OUTPUT.json

INPUT.json: {"trust_remote_code": bool, "windows": [[ids...]...] (seq + 1 ids each),
"texts": [str...], "prompt": str, "max_new_tokens": int}

OUTPUT.json: the model's class, the weights it lacked or did not use, its logits on every window but the last id (flat, row-major
[windows, seq, vocab]), the mean next-token cross-entropy over the windows, the largest
difference between the logits of window 0 run one token at a time through the key/value
cache and run whole, the tokenizer's ids of each text and its decoding of them, and the ids
greedy generation adds to the prompt.
"""

import json
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    model_dir, input_path, output_path = sys.argv[1:4]
    with open(input_path, encoding="utf-8") as f:
        spec = json.load(f)
    remote = spec["trust_remote_code"]
    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, trust_remote_code=remote, dtype=torch.float32, output_loading_info=True
    )
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=remote)
    windows = torch.tensor(spec["windows"], dtype=torch.long)
    inputs, targets = windows[:, :-1], windows[:, 1:]
    with torch.no_grad():
        logits = model(input_ids=inputs, use_cache=False).logits
        vocab = logits.shape[-1]
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        # Window 0 one token at a time through the cache.
        past = None
        steps = []
        for t in range(inputs.shape[1]):
            out = model(input_ids=inputs[:1, t : t + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            steps.append(out.logits[0, 0])
        cached = torch.stack(steps)
        cached_diff = (cached - logits[0]).abs().max().item()
        prompt = tokenizer(spec["prompt"], return_tensors="pt")["input_ids"]
        generated = model.generate(
            prompt, max_new_tokens=spec["max_new_tokens"], do_sample=False
        )
    ids = [tokenizer(text)["input_ids"] for text in spec["texts"]]
    result = {
        "class": type(model).__name__,
        "missing": sorted(info["missing_keys"]),
        "unexpected": sorted(info["unexpected_keys"]),
        "logits": logits.reshape(-1).tolist(),
        "loss": loss.item(),
        "cached_max_diff": cached_diff,
        "ids": ids,
        "decoded": [tokenizer.decode(i) for i in ids],
        "prompt_ids": prompt[0].tolist(),
        "generated": generated[0, prompt.shape[1] :].tolist(),
    }
    with open(output_path, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
