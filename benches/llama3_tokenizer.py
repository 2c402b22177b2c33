"""Writes Llama 3's 128,256-id tokenizer as a Hugging Face tokenizer.json that iota loads, for
`iota bench data --tokenizer`. The tokenizer is not in this repository (Llama 3 license): this
script downloads the PyPI package `llama-models==0.3.0` (a 6.6 MB wheel, with pip, no
dependencies), reads `llama_models/llama3/tokenizer.model` (tiktoken's format: one base64
token and its rank per line) and converts it:

- vocabulary: each token's bytes spelt with the byte-level alphabet (GPT-2's: printable
  Latin-1 bytes stand for themselves, the others for characters from U+0100 on), id = rank;
- merges: every split of a token into two tokens of the vocabulary, ordered by the rank of
  the token they make, then by the ranks of the two halves;
- the 256 special tokens at ids 128000-128255 (`<|end_of_text|>` is 128001, the separator
  iota packs documents with);
- Llama 3's pre-tokenizer regex, then byte-level, no normalizer, no post-processor.

Usage: python3 llama3_tokenizer.py OUT.json
"""

import base64
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llama-models==0.3.0"
MODEL = "llama_models/llama3/tokenizer.model"
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
NAMED_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
]
SPECIALS = 256


def spelling():
    """byte -> the character that stands for it in a byte-level vocabulary."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, shifted = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + shifted)
            shifted += 1
    return table


def ranks_from_pypi():
    """The token ranks of the downloaded package's tokenizer.model."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", PACKAGE, "-d", tmp],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        text = zipfile.ZipFile(wheel).read(MODEL).decode()
    ranks = {}
    for line in text.splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def main():
    out = Path(sys.argv[1])
    ranks = ranks_from_pypi()
    table = spelling()
    spell = lambda token: "".join(table[b] for b in token)  # noqa: E731
    vocab = {spell(token): rank for token, rank in ranks.items()}
    merges = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], spell(left), spell(right)))
    merges.sort()
    base = len(ranks)
    names = NAMED_SPECIALS + [
        f"<|reserved_special_token_{i}|>" for i in range(2, 2 + SPECIALS - len(NAMED_SPECIALS))
    ]
    added = [
        {
            "id": base + i,
            "content": name,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, name in enumerate(names)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": SPLIT}, "behavior": "Isolated", "invert": False},
                byte_level,
            ],
        },
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab,
            "merges": [[left, right] for _, _, _, left, right in merges],
        },
    }
    out.write_text(json.dumps(tokenizer, ensure_ascii=False))
    print(f"wrote {out}: {base + SPECIALS} ids, {len(merges)} merges", file=sys.stderr)


if __name__ == "__main__":
    main()
