#!/usr/bin/python3
"""Writes vllm_vectors.json: vLLM's prefix-cache block hashes, which
blockhash/vectors_test.go checks the Go hasher against.

vLLM (vllm/v1/core/kv_cache_utils.py, vllm/utils/hashing.py) hashes a prompt
one full block at a time; a trailing partial block is not hashed:

    NONE_HASH = H(seed)                  seed: the PYTHONHASHSEED string
    h_i       = H((h_{i-1} or NONE_HASH, tuple(tokens of block i), extra_keys_i))

H serialises with canonical CBOR (cbor2.dumps(x, canonical=True)) or pickle
(protocol HIGHEST_PROTOCOL) and digests with SHA-256 or XXH3-128. KV events
carry the last 8 bytes of a digest as an unsigned big-endian integer. This
script calls the same libraries the same way, so its digests are vLLM's.

Needs Debian's python3 with python3-cbor2 and python3-xxhash:
    /usr/bin/python3 blockhash/testdata/gen_vllm_vectors.py          # rewrite the file
    /usr/bin/python3 blockhash/testdata/gen_vllm_vectors.py --check  # exit 1 if it differs
"""
import difflib
import hashlib
import importlib.metadata
import json
import os
import pickle
import platform
import sys

import cbor2
import xxhash

GENERATOR = "blockhash/testdata/gen_vllm_vectors.py"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_vectors.json")
BLOCK_SIZE = 16
SEEDS = ["0", "42", "vllm-none-hash"]


def cbor(x):
    return cbor2.dumps(x, canonical=True)


def pickled(x):
    return pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)


# The four --prefix-caching-hash-algo values: (serialiser, digest).
ALGOS = {
    "sha256_cbor": (cbor, lambda b: hashlib.sha256(b).digest()),
    "xxhash_cbor": (cbor, xxhash.xxh3_128_digest),
    "sha256": (pickled, lambda b: hashlib.sha256(b).digest()),
    "xxhash": (pickled, xxhash.xxh3_128_digest),
}


def digest(algo, x):
    serialise, sum_ = ALGOS[algo]
    return sum_(serialise(x))


def event_int(d):
    return int.from_bytes(d, "big") & (2**64 - 1)


def as_int64(u):
    return u - 2**64 if u >= 2**63 else u


def extra_keys(spec, start, end):
    """vLLM's generate_block_hash_extra_keys: LoRA name (every block), one
    key per multimodal item overlapping the block, cache salt (first block
    only), prompt-embeds digest; None when there are none."""
    keys = []
    if spec.get("lora_name"):
        keys.append(spec["lora_name"])
    for item in spec.get("mm", []):
        if start < item["offset"] + item["length"] and item["offset"] < end:
            if spec.get("mm_legacy_no_offset"):
                keys.append(item["identifier"])
            else:
                keys.append((item["identifier"], item["offset"] - start))
    if start == 0 and spec.get("cache_salt"):
        keys.append(spec["cache_salt"])
    for pe in spec.get("prompt_embeds_digests", []):
        if pe["start"] == start:
            keys.append(bytes.fromhex(pe["sha256_hex"]))
    return tuple(keys) if keys else None


def to_json(x):
    """Tuples become lists, bytes {"$bytes": hex}: the form the Go tests read."""
    if isinstance(x, bytes):
        return {"$bytes": x.hex()}
    if isinstance(x, (tuple, list)):
        return [to_json(v) for v in x]
    return x


def chain(algo, seed, tokens, spec):
    parent = digest(algo, seed)
    blocks = []
    for i in range(len(tokens) // BLOCK_SIZE):
        start, end = i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE
        keys = extra_keys(spec, start, end)
        value = (parent, tuple(tokens[start:end]), keys)
        d = digest(algo, value)
        block = {
            "index": i,
            "token_range": [start, end],
            "extra_keys": to_json(keys),
            "parent_hex": parent.hex(),
            "hash_hex": d.hex(),
            "event_int": event_int(d),
            "event_int_hex": "%016x" % event_int(d),
            "event_int_as_int64": as_int64(event_int(d)),
        }
        if ALGOS[algo][0] is cbor:
            block["hash_input_cbor_hex"] = cbor(value).hex()
        blocks.append(block)
        parent = d
    return blocks


MM_ITEM = {"identifier": "img-0123abcd", "offset": 4, "length": 20}
MM_TOKENS = [7] * 4 + [151655] * 20 + list(range(1000, 1024))
# (name, description, tokens, spec)
SCENARIOS = [
    ("range48", "tokens 0..47, 3 full blocks", list(range(48)), {}),
    ("len40_partial", "40 tokens (100..139): 2 full blocks, last 8 tokens ignored", list(range(100, 140)), {}),
    ("large_ids", "ids spanning CBOR/pickle int widths incl. >2^16, >2^31, >=2^32",
     [0, 1, 23, 24, 255, 256, 65535, 65536, 65537, 100000, 151643, 151645,
      2**31 - 1, 2**31, 2**31 + 5, 2**32 - 1, 2**32, 2**33 + 7, 128000, 128001,
      200019, 262143, 262144, 3, 4, 5, 2**31 + 2**30, 70000, 80000, 90000, 4000000000, 12], {}),
    ("range48_lora", "tokens 0..47 with LoRA adapter name 'sql-lora' (every block)",
     list(range(48)), {"lora_name": "sql-lora"}),
    ("range48_salt", "tokens 0..47 with cache_salt 'tenant-a' (first block only)",
     list(range(48)), {"cache_salt": "tenant-a"}),
    ("range48_lora_salt", "LoRA 'sql-lora' + cache_salt 'tenant-a' (order: lora, mm, salt)",
     list(range(48)), {"lora_name": "sql-lora", "cache_salt": "tenant-a"}),
    ("mm_offset", "one MM item identifier 'img-0123abcd' at token offset 4, length 20 "
     "(vLLM >= PR #36708 shape: (identifier, offset - block_start), offset may be negative)",
     MM_TOKENS, {"mm": [MM_ITEM]}),
    ("mm_legacy", "same as mm_offset but legacy MM extra key = bare identifier string (vLLM before PR #36708)",
     MM_TOKENS, {"mm_legacy_no_offset": True, "mm": [MM_ITEM]}),
    ("prompt_embeds_synthetic", "synthetic prompt-embeds digests as 32-byte bytes extra keys "
     "(real value = sha256 of the block's embedding tensor bytes)",
     [0] * 32, {"prompt_embeds_digests": [
         {"start": 16 * i, "sha256_hex": hashlib.sha256(b"embeds-block-%d" % i).hexdigest()} for i in range(2)]}),
]


def version(dist, module):
    """The installed version; Debian's python3-xxhash reports 0.0.0 to
    importlib, so fall back to the module's own VERSION."""
    try:
        v = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        v = "0.0.0"
    return v if v != "0.0.0" else getattr(module, "VERSION", "unknown")


def build():
    doc = {
        "generator": GENERATOR,
        "libs": {"cbor2": version("cbor2", cbor2), "xxhash": version("xxhash", xxhash),
                 "python": platform.python_version()},
        "block_size": BLOCK_SIZE,
        "event_int_rule": "int.from_bytes(digest,'big') & (2**64-1)  == last 8 bytes, big-endian, unsigned",
        "none_hash": {},
        "vectors": {},
    }
    for algo, (serialise, _) in ALGOS.items():
        doc["none_hash"][algo] = {
            seed: {"hex": digest(algo, seed).hex(), "input_hex": serialise(seed).hex()} for seed in SEEDS}
        doc["vectors"][algo] = {
            seed: {name: {"desc": desc, "tokens": tokens, "spec": spec, "blocks": chain(algo, seed, tokens, spec)}
                   for name, desc, tokens, spec in SCENARIOS}
            for seed in SEEDS}
    # The input of vLLM's own tests/v1/core/test_kv_cache_utils.py::test_hash_block_tokens.
    unit = (b"123", (1, 2, 3), ("key1", "key2"))
    doc["vllm_test_hash_block_tokens"] = {"input": repr(unit), **{a: digest(a, unit).hex() for a in ALGOS}}
    # A hybrid-model group of block size 32 over 16-token hashes concatenates
    # them (BlockHashListWithBlockSize); its event int is its last part's.
    b = doc["vectors"]["sha256_cbor"]["0"]["range48"]["blocks"]
    merged = bytes.fromhex(b[0]["hash_hex"] + b[1]["hash_hex"])
    doc["hma_concat_example"] = {
        "desc": "BlockHashListWithBlockSize: group block_size=32 over hash_block_size=16 -> "
                "concatenate consecutive 16-token hashes (sha256_cbor, seed '0', range48 blocks 0+1)",
        "merged_hex": merged.hex(),
        "event_int": event_int(merged),
        "equals_event_int_of_block1": event_int(merged) == b[1]["event_int"],
    }
    return doc


def render(doc):
    return json.dumps(doc, indent=1) + "\n"


def main():
    check = sys.argv[1:] == ["--check"]
    if sys.argv[1:] and not check:
        sys.exit("usage: gen_vllm_vectors.py [--check]")
    doc = build()
    if not check:
        with open(OUT, "w") as f:
            f.write(render(doc))
        return 0
    with open(OUT) as f:
        committed = f.read()
    recorded = json.loads(committed).get("libs")
    if recorded != doc["libs"]:
        # Library versions are a record, not a result: compare the values.
        print(f"note: file made with {recorded}, checking with {doc['libs']}")
        doc["libs"] = recorded
    if render(doc) == committed:
        print(f"{GENERATOR}: vllm_vectors.json is up to date")
        return 0
    sys.stdout.writelines(list(difflib.unified_diff(
        committed.splitlines(True), render(doc).splitlines(True), "committed", "regenerated"))[:60])
    print(f"{GENERATOR}: vllm_vectors.json differs from what the generator computes")
    return 1


if __name__ == "__main__":
    sys.exit(main())
