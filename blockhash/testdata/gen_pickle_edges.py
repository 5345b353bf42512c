#!/usr/bin/python3
"""Golden pickle bytes for shapes the vLLM vectors do not reach.

Run with Debian's /usr/bin/python3 (CPython's C pickler is the reference):
    /usr/bin/python3 blockhash/testdata/gen_pickle_edges.py          # rewrite pickle_edges.json
    /usr/bin/python3 blockhash/testdata/gen_pickle_edges.py --check  # exit 1 if it differs
Each case records the exact bytes pickle.dumps((parent, tuple(tokens), extra), protocol=5)
produces; extra uses JSON lists for tuples, {"$bytes": hex} for bytes, null for None.
"""
import hashlib
import json
import os
import pickle
import sys

GENERATOR = "blockhash/testdata/gen_pickle_edges.py"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pickle_edges.json")


def to_py(x):
    if x is None:
        return None
    if isinstance(x, dict):
        return bytes.fromhex(x["$bytes"])
    if isinstance(x, list):
        return tuple(to_py(v) for v in x)
    return x


P32 = "11" * 32
P16 = "22" * 16
CASES = [
    ("small_ids", P32, list(range(16)), None),
    ("int_opcode_edges", P32, [0, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**40, 2**63 - 1, 2**63, 2**64 - 1], None),
    ("empty_tokens", P32, [], None),
    ("one_token", P32, [7], None),
    ("three_tokens", P16, [1, 2, 3], None),
    ("four_tokens", P16, [1, 2, 3, 4], None),
    ("empty_extra_tuple", P32, list(range(16)), []),
    ("negative_ints", P32, [1], [["i0", -1], ["i1", -128], ["i2", -129], ["i3", -32768], ["i4", -2**31], ["i5", -2**31 - 1], ["i6", -2**32], ["i7", -2**39], ["i8", -2**40], ["i9", -2**63]]),
    ("long_str", P32, [1, 2], ["L" * 300, "s"]),
    ("long_bytes", P32, [1, 2], [{"$bytes": "ab" * 300}]),
    ("unicode_str", P32, [1, 2], ["\u00e9t\u00e9-\u4e2d\u6587-\U0001f600"]),
    ("nested_long_tuple", P32, [1], [["a", 1, "b", 2, "c"]]),
    ("embeds_digest", P32, list(range(16)), [{"$bytes": "cd" * 32}]),
    # 9,357 to 9,360 tokens of 7-byte LONG1 ints straddle the first 64 KiB frame boundary.
    ("frame_boundary_9357", P32, {"start": 2**32, "count": 9357, "mod": 0}, None),
    ("frame_boundary_9358", P32, {"start": 2**32, "count": 9358, "mod": 0}, None),
    ("frame_boundary_9359", P32, {"start": 2**32, "count": 9359, "mod": 0}, None),
    ("frame_split_20000", P32, {"start": 2**32, "count": 20000, "mod": 0}, ["lora"]),
    ("frame_split_small_ints", P32, {"start": 0, "count": 40000, "mod": 256}, None),
]


def expand(tokens):
    """Large cases give tokens as a rule: start+i (mod "mod" when non-zero)."""
    if isinstance(tokens, list):
        return tokens
    n, start, mod = tokens["count"], tokens["start"], tokens["mod"]
    return [(start + i) % mod if mod else start + i for i in range(n)]

SEEDS = ["0", "42", "vllm-none-hash", "S" * 300, ""]


def build():
    cases = []
    for name, parent, tokens, extra in CASES:
        obj = (bytes.fromhex(parent), tuple(expand(tokens)), to_py(extra))
        data = pickle.dumps(obj, protocol=5)
        case = {"name": name, "parent_hex": parent, "extra": extra}
        if isinstance(tokens, list):
            case["tokens"] = tokens
        else:
            case["token_rule"] = tokens
        if len(data) <= 4096:
            case["pickle_hex"] = data.hex()
        else:
            case["pickle_len"] = len(data)
            case["pickle_sha256"] = hashlib.sha256(data).hexdigest()
        cases.append(case)
    seeds = [{"seed": s, "pickle_hex": pickle.dumps(s, protocol=5).hex()} for s in SEEDS]
    return {"generator": GENERATOR, "python": sys.version.split()[0], "blocks": cases, "seeds": seeds}


def render(doc):
    return json.dumps(doc, indent=None, separators=(",", ":")) + "\n"


def main():
    check = sys.argv[1:] == ["--check"]
    if sys.argv[1:] and not check:
        sys.exit("usage: gen_pickle_edges.py [--check]")
    doc = build()
    if not check:
        with open(OUT, "w") as f:
            f.write(render(doc))
        return 0
    with open(OUT) as f:
        committed = f.read()
    # The Python version is a record, not a result: compare the bytes.
    doc["python"] = json.loads(committed).get("python")
    if render(doc) == committed:
        print(f"{GENERATOR}: pickle_edges.json is up to date")
        return 0
    print(f"{GENERATOR}: pickle_edges.json differs from what the generator computes")
    return 1


if __name__ == "__main__":
    sys.exit(main())
