"""Writes the data files `tests/data_formats.rs` reads, with writers that are not iota's:
Parquet shards by pyarrow, `.jsonl.gz` by Python's gzip module, `.jsonl.zst` by the
`zstandard` package. Prints one JSON object: for each file written, the documents a reader
must find in it, in order (null rows and blank lines left out).

Usage: python write_files.py OUT_DIR
"""

import gzip
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard


def texts(prefix, n):
    """n documents with multi-byte characters, newlines, quotes and an empty one."""
    out = []
    for i in range(n):
        if i % 11 == 5:
            out.append("")
        else:
            out.append(f"{prefix} {i}: naïve café ✓ «{i * i}»\nline two \"q\" " + "x" * (i % 7))
    return out


def main():
    out = Path(sys.argv[1])
    expected = {}

    # A folder of shards, as FineWeb-edu ships them: snappy, dictionary pages, several row
    # groups, other columns around the text, a few nulls.
    shards = out / "shards"
    shards.mkdir(parents=True)
    a = texts("alpha", 50)
    a_nullable = [None if i % 13 == 7 else t for i, t in enumerate(a)]
    table = pa.table(
        {
            "id": pa.array(range(50), pa.int64()),
            "text": pa.array(a_nullable, pa.string()),
            "url": pa.array([f"https://example.org/{i}" for i in range(50)], pa.string()),
        }
    )
    pq.write_table(table, shards / "000_00000.parquet", compression="snappy", row_group_size=8)
    expected["shards/000_00000.parquet"] = [t for t in a_nullable if t is not None]
    assert pq.ParquetFile(shards / "000_00000.parquet").num_row_groups == 7

    # zstd, no dictionary, data page v2, large_string, a required (non-null) column.
    b = texts("beta", 30)
    schema = pa.schema([pa.field("text", pa.large_string(), nullable=False)])
    pq.write_table(
        pa.table({"text": pa.array(b, pa.large_string())}, schema=schema),
        shards / "001_00000.parquet",
        compression="zstd",
        use_dictionary=False,
        data_page_version="2.0",
        row_group_size=12,
    )
    expected["shards/001_00000.parquet"] = b
    assert pq.ParquetFile(shards / "001_00000.parquet").num_row_groups == 3

    # A subfolder: read after the files of its parent whose names sort before it.
    (shards / "more").mkdir()
    c = texts("gamma", 5)
    pq.write_table(pa.table({"text": c}), shards / "more" / "002.parquet", compression="snappy")
    expected["shards/more/002.parquet"] = c

    # Other codecs: gzip and none are read; brotli is not built in.
    codecs = out / "codecs"
    codecs.mkdir()
    for codec in ["gzip", "none"]:
        e = texts(codec, 20)
        pq.write_table(pa.table({"text": e}), codecs / f"{codec}.parquet", compression=codec)
        expected[f"codecs/{codec}.parquet"] = e

    # The text under another column name.
    content = texts("delta", 9)
    pq.write_table(
        pa.table({"content": content, "n": list(range(9))}),
        out / "content.parquet",
        compression="snappy",
    )
    expected["content.parquet"] = content

    # Wrong schemas: a non-string `text`, a binary `text`, a list of strings.
    bad = out / "bad"
    bad.mkdir()
    pq.write_table(pa.table({"text": pa.array([1, 2, 3], pa.int64())}), bad / "int.parquet")
    pq.write_table(pa.table({"text": pa.array([b"a", b"b"], pa.binary())}), bad / "binary.parquet")
    pq.write_table(
        pa.table({"text": pa.array([["a", "b"], ["c"]], pa.list_(pa.string()))}),
        bad / "list.parquet",
    )

    pq.write_table(pa.table({"text": ["a", "b"]}), bad / "brotli.parquet", compression="brotli")

    # Compressed JSON lines; a blank line, CRLF endings, other fields.
    d = texts("epsilon", 12)
    lines = [json.dumps({"id": i, "text": t}) for i, t in enumerate(d)]
    body = ("\n".join(lines[:6]) + "\n\n" + "\r\n".join(lines[6:]) + "\r\n").encode()
    jsonl = out / "jsonl"
    jsonl.mkdir()
    (jsonl / "d.jsonl.gz").write_bytes(gzip.compress(body))
    expected["jsonl/d.jsonl.gz"] = d
    (jsonl / "e.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(body))
    expected["jsonl/e.jsonl.zst"] = d
    # Two gzip members and two zstd frames, as `cat a.gz b.gz` makes.
    half = len(body) // 2
    cut = body.index(b"\n", half) + 1
    (jsonl / "f.jsonl.gz").write_bytes(gzip.compress(body[:cut]) + gzip.compress(body[cut:]))
    expected["jsonl/f.jsonl.gz"] = d
    z = zstandard.ZstdCompressor()
    (jsonl / "g.jsonl.zst").write_bytes(z.compress(body[:cut]) + z.compress(body[cut:]))
    expected["jsonl/g.jsonl.zst"] = d
    # Other names in the same field.
    (out / "content.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(
            "".join(json.dumps({"content": t}) + "\n" for t in content).encode()
        )
    )
    expected["content.jsonl.zst"] = content

    # A corpus for `iota train`: enough text for a few steps of the tiny preset.
    corpus = out / "corpus"
    corpus.mkdir()
    for shard in range(3):
        rows = [
            f"Shard {shard} row {r}. " + "The quick brown fox jumps over the lazy dog. " * 4
            for r in range(60)
        ]
        pq.write_table(
            pa.table({"text": rows}),
            corpus / f"{shard:03}.parquet",
            compression="snappy",
            row_group_size=25,
        )
        expected[f"corpus/{shard:03}.parquet"] = rows

    json.dump(expected, sys.stdout)


if __name__ == "__main__":
    main()
